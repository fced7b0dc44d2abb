//! The tokenizer gives transformers' ids on odd texts: empty, whitespace only, accents, CJK,
//! emoji, longer than the model's positions (cut to 16 with `[SEP]` last).

use burn_pretrained::{PretrainedError, Tokenizer};

use crate::common::{expected, fixture_dir};

const CLS: i64 = 2;
const SEP: i64 = 3;

fn tokenizer() -> Tokenizer {
    let expected = expected();
    Tokenizer::from_file(fixture_dir().join("tokenizer.json"), expected.max_length).unwrap()
}

#[test]
fn odd_texts_match_transformers() {
    let tokenizer = tokenizer();
    let expected = expected();
    let max = expected.max_length;
    let mut truncated = 0;
    for odd in &expected.odd_texts {
        let batch = tokenizer.encode(&[odd.text.as_str()]).unwrap();
        assert_eq!(batch.ids, odd.ids, "{:?}", odd.text);
        assert_eq!(
            (batch.batch, batch.seq, batch.lengths.clone()),
            (1, odd.ids.len(), vec![odd.ids.len()])
        );
        assert!(batch.type_ids.iter().all(|&t| t == 0));
        assert_eq!(
            (batch.ids[0], *batch.ids.last().unwrap()),
            (CLS, SEP),
            "{:?}",
            odd.text
        );
        if odd.text.trim().is_empty() {
            assert_eq!(
                batch.ids,
                [CLS, SEP],
                "{:?}: its special tokens alone",
                odd.text
            );
        }
        truncated += usize::from(batch.seq == max);
        assert!(batch.seq <= max);
    }
    assert!(truncated >= 1, "no text reaches the maximum");
    // Unknown characters (emoji) are [UNK], CJK characters are tokens of their own.
    assert!(expected.odd_texts.iter().any(|o| o.ids.contains(&1)));
}

/// The same texts in one batch: each row is its ids, then `[PAD]` (0) to the longest.
#[test]
fn odd_texts_batched_are_padded() {
    let tokenizer = tokenizer();
    let expected = expected();
    let texts: Vec<&str> = expected.odd_texts.iter().map(|o| o.text.as_str()).collect();
    let batch = tokenizer.encode(&texts).unwrap();
    let seq = expected
        .odd_texts
        .iter()
        .map(|o| o.ids.len())
        .max()
        .unwrap();
    assert_eq!((batch.batch, batch.seq), (texts.len(), seq));
    for (i, odd) in expected.odd_texts.iter().enumerate() {
        let row = &batch.ids[i * seq..(i + 1) * seq];
        assert_eq!(&row[..odd.ids.len()], odd.ids, "{:?}", odd.text);
        assert!(
            row[odd.ids.len()..].iter().all(|&id| id == 0),
            "{:?}: padding",
            odd.text
        );
        assert_eq!(batch.lengths[i], odd.ids.len());
    }
}

#[test]
fn shorter_maximum_cuts_with_sep_last() {
    let tokenizer = Tokenizer::from_file(fixture_dir().join("tokenizer.json"), 5).unwrap();
    let batch = tokenizer.encode(&["Hello world and the sea", "a"]).unwrap();
    assert_eq!((batch.seq, batch.lengths.clone()), (5, vec![5, 3]));
    // "Hello, world." is [CLS] hello , world . [SEP]: the ids of "hello" and "world".
    let odd = expected().odd_texts;
    let full = &odd.iter().find(|o| o.text == "Hello, world.").unwrap().ids;
    let (hello, world) = (full[1], full[3]);
    assert_eq!(batch.ids[..3], [CLS, hello, world]);
    assert_eq!(batch.ids[4], SEP);
    assert_eq!((batch.ids[5], batch.ids[7], batch.ids[8]), (CLS, SEP, 0));
    assert!(matches!(
        Tokenizer::from_file(fixture_dir().join("tokenizer.json"), 1),
        Err(PretrainedError::Input(_))
    ));
}

#[test]
fn empty_batch_is_an_input_error() {
    let tokenizer = tokenizer();
    let texts: [&str; 0] = [];
    match tokenizer.encode(&texts) {
        Err(PretrainedError::Input(message)) => assert!(message.contains("no text"), "{message}"),
        other => panic!("expected an Input error, got {other:?}"),
    }
}

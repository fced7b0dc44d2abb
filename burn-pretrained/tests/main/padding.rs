//! Padding is invisible: a text alone and the same text inside a padded batch have the same
//! states at its real positions and the same sentence embedding.

use burn::backend::{Flex, NdArray};
use burn_sketch::SketchBackend;

use crate::common::{embed, expected, load, max_abs};

fn alone_equals_batched<B: SketchBackend>(device: &B::Device) {
    let model = load::<B>(device);
    let expected = expected();
    let texts: Vec<&str> = expected.batch.texts.iter().map(String::as_str).collect();
    let batch = model.tokenizer.encode(&texts).unwrap();
    // The batch pads: its texts differ in length.
    assert!(batch.lengths.iter().any(|&n| n < batch.seq));
    let hidden = expected.hidden_size;
    let (batched, batched_states) = embed(&model, &texts, device);
    for (i, text) in texts.iter().enumerate() {
        let length = batch.lengths[i];
        let (alone, alone_states) = embed(&model, &[text], device);
        assert_eq!(
            alone_states.len(),
            length * hidden,
            "text {i} alone is not padded"
        );
        let inside = &batched_states[i * batch.seq * hidden..(i * batch.seq + length) * hidden];
        let gap = max_abs(&alone_states, inside);
        assert!(
            gap <= 1e-5,
            "text {i}: states alone and in the batch differ by {gap}"
        );
        let gap = max_abs(&alone[0], &batched[i]);
        assert!(
            gap <= 1e-5,
            "text {i}: embeddings alone and in the batch differ by {gap}"
        );
    }
}

#[test]
fn flex_padding_is_masked() {
    alone_equals_batched::<Flex>(&Default::default());
}

#[test]
fn ndarray_padding_is_masked() {
    alone_equals_batched::<NdArray>(&Default::default());
}

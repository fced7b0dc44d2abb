//! What does not fit is a typed error naming it: checkpoint keys that are missing, misshapen
//! or not floating point (in Hugging Face's names), configuration values this crate does not
//! build, files that are not there.

use burn::backend::Flex;
use burn_pretrained::{Misshapen, Pretrained, PretrainedError, load_hf};
use safetensors::Dtype;

use crate::common::{Entry, checkpoint, config_with, model_dir};

fn load_dir(dir: &tempfile::TempDir) -> Result<Pretrained<Flex>, PretrainedError> {
    load_hf::<Flex>(dir.path(), &Default::default())
}

/// The three lists of a `Checkpoint` error, which must name the directory's checkpoint.
fn checkpoint_error(
    result: Result<Pretrained<Flex>, PretrainedError>,
    dir: &tempfile::TempDir,
) -> (Vec<String>, Vec<Misshapen>, Vec<String>) {
    match result {
        Err(PretrainedError::Checkpoint {
            path,
            missing,
            misshapen,
            not_float,
        }) => {
            assert_eq!(path, dir.path().join("model.safetensors"));
            (missing, misshapen, not_float)
        }
        Err(other) => panic!("expected a Checkpoint error, got {other}"),
        Ok(_) => panic!("expected a Checkpoint error, the checkpoint loaded"),
    }
}

#[test]
fn missing_keys_are_named() {
    let gone = [
        "encoder.layer.1.intermediate.dense.weight",
        "embeddings.LayerNorm.bias",
    ];
    let entries: Vec<Entry> = checkpoint()
        .into_iter()
        .filter(|e| !gone.contains(&e.key.as_str()))
        .collect();
    let dir = model_dir(&entries, None);
    let result = load_dir(&dir);
    let message = result
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let (mut missing, misshapen, not_float) = checkpoint_error(result, &dir);
    missing.sort();
    let mut want = gone.map(String::from).to_vec();
    want.sort();
    assert_eq!(missing, want);
    assert!(misshapen.is_empty() && not_float.is_empty());
    assert!(
        message.contains(gone[0]) && message.contains(gone[1]),
        "{message}"
    );
}

#[test]
fn misshapen_key_is_named_with_both_shapes() {
    let key = "encoder.layer.0.attention.self.query.weight";
    let mut entries = checkpoint();
    let entry = entries.iter_mut().find(|e| e.key == key).unwrap();
    *entry = Entry::f32(key, vec![31, 32], 0.1);
    let dir = model_dir(&entries, None);
    let (missing, misshapen, not_float) = checkpoint_error(load_dir(&dir), &dir);
    assert!(missing.is_empty() && not_float.is_empty());
    assert_eq!(
        misshapen,
        [Misshapen {
            key: key.into(),
            expected: vec![32, 32],
            found: vec![31, 32],
        }]
    );
}

#[test]
fn integer_weight_is_named() {
    let key = "embeddings.token_type_embeddings.weight";
    let mut entries = checkpoint();
    let entry = entries.iter_mut().find(|e| e.key == key).unwrap();
    assert_eq!(entry.shape, [2, 32]);
    entry.dtype = Dtype::I64;
    entry.data = (0..64i64).flat_map(i64::to_le_bytes).collect();
    let dir = model_dir(&entries, None);
    let (missing, misshapen, not_float) = checkpoint_error(load_dir(&dir), &dir);
    assert!(missing.is_empty() && misshapen.is_empty());
    assert_eq!(not_float, [format!("{key} (I64)")]);
}

/// The checkpoint of a `BertFor…` model is named in the encoder's terms, without `bert.`.
#[test]
fn prefixed_checkpoint_names_keys_without_prefix() {
    let gone = "encoder.layer.0.output.dense.bias";
    let entries: Vec<Entry> = checkpoint()
        .into_iter()
        .filter(|e| e.key != gone)
        .map(|e| Entry {
            key: format!("bert.{}", e.key),
            ..e
        })
        .collect();
    let dir = model_dir(&entries, None);
    let (missing, misshapen, not_float) = checkpoint_error(load_dir(&dir), &dir);
    assert_eq!(missing, [gone]);
    assert!(misshapen.is_empty() && not_float.is_empty());
}

fn config_error(config: String) -> (std::path::PathBuf, String, tempfile::TempDir) {
    let dir = model_dir(&checkpoint(), Some(&config));
    match load_dir(&dir) {
        Err(PretrainedError::Config { path, reason }) => (path, reason, dir),
        Err(other) => panic!("expected a Config error, got {other}"),
        Ok(_) => panic!("expected a Config error, the model loaded"),
    }
}

#[test]
fn unsupported_activation_is_named() {
    let (path, reason, dir) = config_error(config_with(|c| c["hidden_act"] = "relu".into()));
    assert_eq!(path, dir.path().join("config.json"));
    assert!(
        reason.contains("hidden_act") && reason.contains("\"relu\""),
        "{reason}"
    );
}

#[test]
fn non_bert_model_type_is_named() {
    let (path, reason, dir) = config_error(config_with(|c| c["model_type"] = "gpt2".into()));
    assert_eq!(path, dir.path().join("config.json"));
    assert!(
        reason.contains("model_type") && reason.contains("\"gpt2\""),
        "{reason}"
    );
}

#[test]
fn heads_that_do_not_divide_the_width_are_named() {
    let (_, reason, _dir) = config_error(config_with(|c| c["num_attention_heads"] = 5.into()));
    assert!(
        reason.contains("num_attention_heads 5") && reason.contains("hidden_size 32"),
        "{reason}"
    );
}

#[test]
fn missing_files_are_named() {
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        let dir = model_dir(&checkpoint(), None);
        std::fs::remove_file(dir.path().join(name)).unwrap();
        match load_dir(&dir) {
            Err(PretrainedError::Io { path, source }) => {
                assert_eq!(path, dir.path().join(name));
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            Err(other) => panic!("{name}: expected an Io error, got {other}"),
            Ok(_) => panic!("{name}: the model loaded without it"),
        }
    }
}

//! Pooling as a directory's sentence-transformers files say: read from `modules.json` and
//! `1_Pooling/config.json`, and computed (mean, CLS, max) with padding masked, against sums
//! written out by hand.

use burn::backend::Flex;
use burn::tensor::{Bool, Tensor, TensorData};
use burn_pretrained::{Pooling, PoolingMode, PretrainedError, load_hf};

use crate::common::fixture_dir;

/// A directory holding `modules` (none: no `modules.json`) and `pooling` as
/// `1_Pooling/config.json`.
fn dir_with(name: &str, modules: Option<&str>, pooling: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "burn-pretrained-pooling-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    let _ = std::fs::remove_file(dir.join("modules.json"));
    if let Some(modules) = modules {
        std::fs::write(dir.join("modules.json"), modules).unwrap();
    }
    std::fs::write(dir.join("1_Pooling/config.json"), pooling).unwrap();
    dir
}

const POOLING_ONLY: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
  {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#;
const NORMALIZED: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
  {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
  {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;

fn config(mode: &str) -> String {
    let on = |m: &str| m == mode;
    format!(
        r#"{{"word_embedding_dimension": 4, "pooling_mode_cls_token": {}, "pooling_mode_mean_tokens": {},
            "pooling_mode_max_tokens": {}, "pooling_mode_mean_sqrt_len_tokens": {}}}"#,
        on("cls"),
        on("mean"),
        on("max"),
        on("sqrt")
    )
}

#[test]
fn the_directory_names_its_pooling() {
    let read =
        |name, modules, mode: &str| Pooling::from_dir(dir_with(name, modules, &config(mode)));
    assert_eq!(
        read("cls", Some(NORMALIZED), "cls").unwrap(),
        Pooling {
            mode: PoolingMode::Cls,
            normalize: true
        }
    );
    assert_eq!(
        read("max", Some(POOLING_ONLY), "max").unwrap(),
        Pooling {
            mode: PoolingMode::Max,
            normalize: false
        }
    );
    // No modules.json: sentence-transformers' default for a plain model.
    assert_eq!(read("plain", None, "cls").unwrap(), Pooling::default());
    // A pooling not computed here is an error naming it.
    let err = read("sqrt", Some(POOLING_ONLY), "sqrt").unwrap_err();
    assert!(matches!(&err, PretrainedError::Config { .. }), "{err}");
    assert!(err.to_string().contains("mean_sqrt_len"), "{err}");
    // The fixture's files: mean, then unit length; load_hf reads them.
    assert_eq!(
        Pooling::from_dir(fixture_dir()).unwrap(),
        Pooling::MEAN_NORMALIZED
    );
    let model = load_hf::<Flex>(fixture_dir(), &Default::default()).unwrap();
    assert_eq!(model.pooling, Pooling::MEAN_NORMALIZED);
}

#[test]
fn each_mode_pools_real_tokens_only() {
    let device = Default::default();
    // Two sequences of three tokens, two features; the second's last token is padding with
    // values that would win a maximum or move a mean.
    let hidden = Tensor::<Flex, 3>::from_data(
        TensorData::new(
            vec![
                1.0f32, -2.0, 3.0, 4.0, -5.0, 0.5, /**/ 2.0, 2.0, -1.0, 6.0, 100.0, 100.0,
            ],
            [2, 3, 2],
        ),
        &device,
    );
    let pad = Tensor::<Flex, 2, Bool>::from_data(
        TensorData::new(vec![false, false, false, false, false, true], [2, 3]),
        &device,
    );
    let pool = |mode, normalize| -> Vec<f32> {
        Pooling { mode, normalize }
            .apply(hidden.clone(), Some(pad.clone()))
            .into_data()
            .to_vec()
            .unwrap()
    };
    let close = |got: Vec<f32>, want: [f32; 4]| {
        assert!(
            got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6),
            "{got:?} against {want:?}"
        )
    };
    close(
        pool(PoolingMode::Mean, false),
        [-1.0 / 3.0, 2.5 / 3.0, 0.5, 4.0],
    );
    close(pool(PoolingMode::Cls, false), [1.0, -2.0, 2.0, 2.0]);
    close(pool(PoolingMode::Max, false), [3.0, 4.0, 2.0, 6.0]);
    let n = (2.0f32 * 2.0 + 2.0 * 2.0).sqrt();
    let m = (1.0f32 + 4.0).sqrt();
    close(
        pool(PoolingMode::Cls, true),
        [1.0 / m, -2.0 / m, 2.0 / n, 2.0 / n],
    );
}

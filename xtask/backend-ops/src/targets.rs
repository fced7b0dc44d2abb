//! What is generated: the traits whose methods are forwarded, and the backend decorators
//! they are forwarded for, each with what its methods do.

/// A trait whose methods are forwarded, and the module of the generated folder that holds its
/// impl (`float` for `ops/float.rs`): one file per trait, as in burn-backend.
pub struct OpsTrait {
    pub name: &'static str,
    pub module: &'static str,
}

/// The traits whose methods are forwarded, in the order they are generated and reported.
pub const TRAITS: [OpsTrait; 6] = [
    OpsTrait {
        name: "FloatTensorOps",
        module: "float",
    },
    OpsTrait {
        name: "IntTensorOps",
        module: "int",
    },
    OpsTrait {
        name: "BoolTensorOps",
        module: "bool",
    },
    OpsTrait {
        name: "ModuleOps",
        module: "module",
    },
    OpsTrait {
        name: "ActivationOps",
        module: "activation",
    },
    OpsTrait {
        name: "QTensorOps",
        module: "qtensor",
    },
];

/// Whether `name` is one of the [`TRAITS`].
pub fn is_forwarded(name: &str) -> bool {
    TRAITS.iter().any(|t| t.name == name)
}

/// A backend decorator whose operation traits are generated.
pub struct Target {
    /// The generated folder, relative to the workspace root: the module `ops` of the
    /// decorator's module, whose `mod.rs` declares one module per trait ([`TRAITS`]). Every
    /// file in it is generated.
    pub output: &'static str,
    /// The implementing type and its impl generics (`impl<B: Backend> … for Profiled<B>`).
    pub implementor: &'static str,
    pub generics: &'static str,
    /// The doc comment of the folder's `mod.rs`, before the lines on how it is generated.
    pub doc: &'static str,
    /// `use` lines of `mod.rs`: the items of the decorator's crate that the trait modules use.
    /// Each trait module imports from `mod.rs` (`use super::{…}`) those of these names that it
    /// mentions.
    pub uses: &'static str,
    pub body: Body,
}

/// What each generated method does.
pub enum Body {
    /// Records the call around `B`'s method (`Profiled<B>`).
    Record,
    /// Calls the method of the backend named `to` (defined in `package`) where that backend
    /// implements the method itself; a method it leaves to the trait's default is left to the
    /// default here too, so that its decomposition runs on this backend's operations (Burn's
    /// `linear` on this backend's `float_matmul`). The `via_f32` methods, given a float
    /// tensor in a half-precision type (`half_dtype`), run `to`'s method on `f32` copies of
    /// their float tensors (`to_f32`) and round a float output back (`from_f32`); the `own`
    /// methods call the function of the same name. These functions are the decorator's
    /// module's (the parent of `ops`): the trait modules call them as `super::to_f32`, and the
    /// folder's `mod.rs` imports every function so called.
    Forward {
        to: &'static str,
        package: &'static str,
        via_f32: &'static [&'static str],
        own: &'static [&'static str],
    },
}

/// The decorators, each with its generated folder.
pub const TARGETS: [Target; 2] = [
    Target {
        output: "burn-profiler/src/ops",
        implementor: "Profiled<B>",
        generics: "<B: Backend>",
        doc: "//! The forwarding of Burn's operation traits for [`Profiled<B>`]: every method calls `B`'s\n\
              //! and records the call ([`Call`]), with the tensors it reads and writes.\n",
        uses: "use super::backend::Profiled;\nuse super::record::{Call, desc};\n",
        body: Body::Record,
    },
    Target {
        output: "burn-fast-cpu/src/fast_flex/ops",
        implementor: "FastFlex",
        generics: "",
        doc: "//! The forwarding of Burn's operation traits for [`FastFlex`]: every method calls Flex's,\n\
              //! except that the arithmetic of half-precision tensors runs as `f32` (converted by\n\
              //! [`to_f32`](super::to_f32), rounded back by [`from_f32`](super::from_f32)) and that\n\
              //! the parent module writes the operations a model spends its time in itself (products,\n\
              //! `linear`, activations, normalisation: its list is `FAST_OWN` in the generator). A\n\
              //! method that Flex leaves to the trait's default is left to it here too, so that its\n\
              //! decomposition runs on `FastFlex`'s operations.\n",
        uses: "use burn::backend::Flex;\n\nuse super::FastFlex;\n",
        body: Body::Forward {
            to: "Flex",
            package: "burn-flex",
            via_f32: HALF_VIA_F32,
            own: FAST_OWN,
        },
    },
];

/// The operations `FastFlex` computes itself, each a function of the same name in
/// `fast_flex/mod.rs`.
const FAST_OWN: &[&str] = &[
    "float_matmul",
    "float_cast",
    "linear",
    "linear_x_backward",
    "linear_weight_backward",
    "linear_bias_backward",
    "gelu",
    "gelu_backward",
    "attention",
    "softmax",
    "log_softmax",
    "layer_norm",
    "float_exp",
    "float_erf",
    "float_tanh",
    "float_mask_fill",
    "float_reshape",
    "float_div_scalar",
    "float_mul_scalar",
    "float_add_scalar",
    "float_add",
];

/// The operations `FastFlex` runs in `f32` for `bf16` and `f16` tensors: arithmetic,
/// reductions, comparisons and activations, which Flex 0.21 computes one value at a time
/// through `half`'s scalar conversions. Operations that only move values (reshape, slice,
/// gather, cat, mask, …) are Flex's, in any type.
const HALF_VIA_F32: &[&str] = &[
    "float_add",
    "float_add_scalar",
    "float_clamp_min",
    "float_clamp_max",
    "float_clamp",
    "float_sub",
    "float_sub_scalar",
    "float_mul",
    "float_mul_scalar",
    "float_div",
    "float_div_scalar",
    "float_remainder",
    "float_remainder_scalar",
    "float_cross",
    "float_neg",
    "float_recip",
    "float_equal",
    "float_not_equal",
    "float_equal_elem",
    "float_not_equal_elem",
    "float_greater",
    "float_greater_elem",
    "float_greater_equal",
    "float_greater_equal_elem",
    "float_lower",
    "float_lower_elem",
    "float_lower_equal",
    "float_lower_equal_elem",
    "float_sum",
    "float_sum_dim",
    "float_prod",
    "float_prod_dim",
    "float_mean",
    "float_mean_dim",
    "float_cumsum",
    "float_cumprod",
    "float_cummin",
    "float_cummax",
    "float_exp",
    "float_log",
    "float_log1p",
    "float_powf",
    "float_powi",
    "float_powi_scalar",
    "float_powf_scalar",
    "float_sqrt",
    "float_abs",
    "float_cos",
    "float_sin",
    "float_tan",
    "float_cosh",
    "float_sinh",
    "float_tanh",
    "float_acos",
    "float_acosh",
    "float_asin",
    "float_asinh",
    "float_atan",
    "float_atanh",
    "float_atan2",
    "float_round",
    "float_floor",
    "float_ceil",
    "float_trunc",
    "float_erf",
    "float_argmax",
    "float_argmin",
    "float_max",
    "float_max_dim",
    "float_min",
    "float_min_dim",
    "float_max_abs",
    "float_max_abs_dim",
    "float_any",
    "float_any_dim",
    "float_all",
    "float_all_dim",
    "float_sign",
    "float_is_nan",
    "float_is_inf",
    "leaky_relu",
    "relu",
    "relu_backward",
    "gelu",
    "prelu",
    "gelu_backward",
    "sigmoid",
    "sigmoid_backward",
    "hard_sigmoid",
    "log_sigmoid",
    "softmax",
    "log_softmax",
    "softmin",
    "log_sigmoid_backward",
];

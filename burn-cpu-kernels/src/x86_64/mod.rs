//! The AVX-512 code of every kernel family, one file each: every `#[target_feature]` function
//! of the crate is here. A kernel's dispatch (beside its portable code) calls into these
//! files only where its [`Isa`](crate::Isa) predicate holds, which is what makes each
//! `unsafe` call sound.

pub(crate) mod attention;
pub(crate) mod bf16;
pub(crate) mod convert;
pub(crate) mod int8;
pub(crate) mod math;
pub(crate) mod peak;
pub(crate) mod rows;
pub(crate) mod sgemm;

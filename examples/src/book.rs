//! The book's pages (`docs/src`), compiled and run as doctests so that every Rust block in
//! them stays true. Blocks that need files or a GPU are marked `no_run`; hidden lines start
//! with `# `, which both rustdoc and mdBook understand. The serving page is a doctest of
//! `examples-serve` instead, which depends on burn-serve (this crate does not, so that the
//! other examples do not link the HTTP stack).

/// One doctest holder per page, named after the page's file.
macro_rules! pages {
    ($($name:ident => $path:literal),* $(,)?) => {
        $(
            #[doc = include_str!(concat!("../../docs/src/", $path))]
            pub struct $name;
        )*
    };
}

pages! {
    Introduction => "introduction.md",
    GettingStarted => "getting-started.md",
    SketchedLayer => "sketching/sketched-layer.md",
    Convolution => "sketching/convolution.md",
    PantherCheckpoints => "sketching/panther-checkpoints.md",
    Transformers => "sketching/transformers.md",
    Backends => "sketching/backends.md",
    CpuPrecision => "sketching/cpu-precision.md",
    LinearAlgebra => "sketching/linear-algebra.md",
    Pruning => "sketching/pruning.md",
    MemoryOverview => "memory/overview.md",
    Measure => "memory/measure.md",
    FindThePeak => "memory/find-the-peak.md",
    Profiler => "memory/profiler.md",
    Checkpointing => "memory/checkpointing.md",
    MixedPrecision => "memory/mixed-precision.md",
    BatchSize => "memory/batch-size.md",
    Offload => "memory/offload.md",
    Placement => "memory/placement.md",
    DataParallel => "memory/data-parallel.md",
    ChunkedInference => "memory/chunked-inference.md",
    BenchmarksOverview => "benchmarks/overview.md",
    Mnist => "benchmarks/mnist.md",
    Cpu => "benchmarks/cpu.md",
    Gpu => "benchmarks/gpu.md",
    LanguageModel => "benchmarks/language-model.md",
    MemoryStudies => "benchmarks/memory.md",
    Development => "development.md",
}

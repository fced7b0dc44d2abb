//! Fused CubeCL kernels for the sketched matmul of `burn-sketch`. Not yet implemented; until
//! they land, every backend uses `burn-sketch`'s tensor-op path.

//! Memory tooling for Burn training: profiling, monitoring, gradient checkpointing, mixed
//! precision and batch-size search. Not yet implemented; see the project's issues.

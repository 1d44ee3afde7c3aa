//! fraglink: CUDA JIT link-time optimisation for Rust GPU libraries.
pub mod build;
pub mod sys;

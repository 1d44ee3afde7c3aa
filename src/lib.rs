//! fraglink: CUDA JIT link-time optimisation for Rust GPU libraries.
//!
//! Fragments are compiled to LTO-IR at build time ([`build`]) and embedded
//! behind tag types ([`fragments`]); at run time a [`link::Planner`] links the
//! ones a configuration needs with nvJitLink (bindings in [`sys`]) and caches
//! the result in memory and on disk. [`gpu`] is the execution contract,
//! [`cost`] routes work between GPU and CPU, [`search`] is the vector search
//! built on the shipped fragment set.

pub mod build;
pub mod cost;
pub mod families;
pub mod fragment;
pub mod fragments;
pub mod gpu;
pub mod link;
pub mod search;
mod switch;
mod sync;
pub mod sys;
mod workers;

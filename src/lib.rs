//! fraglink: CUDA JIT link-time optimisation for Rust GPU libraries.
//!
//! Fragments are compiled to LTO-IR at build time ([`build`]) and embedded
//! behind tag types ([`fragments`]); at run time they are linked with
//! nvJitLink through the raw bindings in [`sys`].

pub mod build;
pub mod fragment;
pub mod fragments;
pub mod sys;

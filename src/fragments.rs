//! fraglink's own vector-search fragment set, generated at build time from
//! `matrices/`, `templates/` and `fragments/`.
//!
//! Tag types name parameter values (`F32`, `L2`, `NoneFilter`, `U32`, …); a
//! fragment type such as `ScanFragment<F32, U32, 4, 128>` implements
//! [`StaticFragment`](crate::fragment::StaticFragment) only if the matrix
//! produced that combination.

use crate::fragment::FragmentInfo;

include!(concat!(env!("OUT_DIR"), "/fraglink_registry.rs"));

/// Architectures the embedded LTO-IR was built for.
pub const BUILD_ARCHS: &str = env!("FRAGLINK_BUILD_ARCHS");

/// NVRTC version that produced the embedded LTO-IR (`major.minor`).
pub const BUILD_NVRTC_VERSION: &str = env!("FRAGLINK_BUILD_NVRTC_VERSION");

/// What the build script did: fragments, bytes, how many came from the
/// content cache, and its wall time.
pub const BUILD_SUMMARY: &str = env!("FRAGLINK_BUILD_SUMMARY");

/// Every embedded fragment.
pub fn catalog() -> &'static [&'static FragmentInfo] {
    &CATALOG
}

/// The fragment called `name`.
pub fn find(name: &str) -> Option<&'static FragmentInfo> {
    crate::fragment::find_in(&CATALOG, name)
}

/// Up to `n` embedded names closest to `name`.
pub fn nearest(name: &str, n: usize) -> Vec<&'static str> {
    crate::fragment::nearest_names(&CATALOG, name, n)
}

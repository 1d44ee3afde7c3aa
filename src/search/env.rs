//! Every run-time variable a search reads, checked at once.
//!
//! Each variable is read by the path that uses it (the tensor-core planner,
//! the splits, the linker), so a bad value surfaced only where that path ran:
//! `FRAGLINK_GPU_KNN=maybe` on a search the CPU served was a note in the
//! JSON report and exit 0. [`check`] asks every reader, so `fraglink search`
//! refuses a bad value whichever device serves it (the README's environment
//! table: "anything else is an error naming it").

use super::knn::gpu as knn_gpu;
use super::{splits, trace};
use crate::link::{runtime, tiered};

/// The first run-time variable holding a value its reader refuses, as that
/// reader's error says it (naming the variable and the value).
pub fn check() -> Result<(), String> {
    knn_gpu::enabled_by_env().map_err(|e| e.to_string())?;
    knn_gpu::shared_bound_by_env().map_err(|e| e.to_string())?;
    knn_gpu::prefetch_by_env().map_err(|e| e.to_string())?;
    if let Some(name) = knn_gpu::variant_by_env() {
        let known = crate::fragments::find(&name).is_some_and(|f| f.family == "knn_tile");
        if !known {
            return Err(format!(
                "FRAGLINK_KNN_VARIANT=`{name}`: no candidate kernel of that name \
                 (`fraglink catalog --family knn_tile` lists them)"
            ));
        }
    }
    trace::enabled_by_env().map_err(|value| {
        format!(
            "{}=`{value}`: expected {}",
            trace::TRACE_VAR,
            crate::switch::SWITCH_EXPECTED
        )
    })?;
    for var in [splits::IVF_SPLITS_VAR, splits::SCAN_SPLITS_VAR] {
        splits::splits_from_env(var)
            .map_err(|value| format!("{var}=`{value}`: expected {}", splits::SPLITS_EXPECTED))?;
    }
    let fast = std::env::var_os(runtime::ENV_FAST_COMPILE);
    runtime::fast_compile_from_env(fast.as_deref()).map_err(|e| e.to_string())?;
    tiered::quick_link_from_env().map_err(|e| e.to_string())?;
    Ok(())
}

//! Minimum architectures: a fragment whose code needs newer hardware (TF32
//! tensor cores from sm_80, wgmma on sm_90a) is built only for the archs it
//! can run on.
//!
//! A family declares it once ([`Family::min_arch`](super::Family::min_arch))
//! or per matrix entry ([`Family::min_arch_key`](super::Family::min_arch_key):
//! a matrix key whose value is the compute capability times ten, `"80"`). A
//! fragment is compiled for the build's archs with `number ≥ min` (the larger
//! of the two when both are given) and records only those, so the linker
//! and `FragmentInfo::archs` know where it exists. A fragment whose minimum
//! leaves none of the build's archs is a build error naming it.

use super::arch::Arch;
use super::matrix::Entry;

/// Why a fragment's minimum arch cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MinArchError {
    #[error("fragment `{fragment}` (family `{family}`): matrix key `{key}` = {value} is not a compute capability (expected e.g. \"80\")")]
    BadValue {
        fragment: String,
        family: String,
        key: String,
        value: String,
    },
    #[error("fragment `{fragment}` (family `{family}`) needs sm_{min} or newer, but the build's archs ({archs}) are all older; add one (FRAGLINK_ARCHS or Builder::archs, e.g. compute_{min})")]
    NoArch {
        fragment: String,
        family: String,
        min: u32,
        archs: String,
    },
}

/// The minimum of one fragment: the family's and its entry's `key` value,
/// the larger of the two.
pub fn fragment_min(
    fragment: &str,
    family: &str,
    family_min: Option<u32>,
    key: Option<&str>,
    entry: &Entry,
) -> Result<Option<u32>, MinArchError> {
    let from_entry = match key.and_then(|k| entry.get(k).map(|v| (k, v))) {
        None => None,
        Some((k, v)) => {
            let text = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            match text.trim().parse::<u32>() {
                Ok(n) if (50..1000).contains(&n) => Some(n),
                _ => {
                    return Err(MinArchError::BadValue {
                        fragment: fragment.into(),
                        family: family.into(),
                        key: k.into(),
                        value: v.to_string(),
                    })
                }
            }
        }
    };
    Ok(match (family_min, from_entry) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    })
}

/// The archs of `archs` a fragment with minimum `min` is built for.
pub fn archs_for(archs: &[Arch], min: Option<u32>) -> Vec<Arch> {
    archs
        .iter()
        .copied()
        .filter(|a| min.is_none_or(|m| a.number >= m))
        .collect()
}

/// [`archs_for`], refusing an empty result.
pub fn check(
    fragment: &str,
    family: &str,
    archs: &[Arch],
    min: Option<u32>,
) -> Result<Vec<Arch>, MinArchError> {
    let kept = archs_for(archs, min);
    match (kept.is_empty(), min) {
        (true, Some(min)) => Err(MinArchError::NoArch {
            fragment: fragment.into(),
            family: family.into(),
            min,
            archs: archs
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }),
        _ => Ok(kept),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(v: serde_json::Value) -> Entry {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_entry_key_and_the_family_minimum_combine() {
        let e = entry(json!({"dtype": "f32", "min_arch": "80"}));
        assert_eq!(
            fragment_min("f", "fam", None, Some("min_arch"), &e),
            Ok(Some(80))
        );
        assert_eq!(
            fragment_min("f", "fam", Some(90), Some("min_arch"), &e),
            Ok(Some(90))
        );
        assert_eq!(fragment_min("f", "fam", Some(75), None, &e), Ok(Some(75)));
        // A key the entry lacks: no minimum from it.
        assert_eq!(fragment_min("f", "fam", None, Some("other"), &e), Ok(None));
        let bad = entry(json!({"min_arch": "sm_80"}));
        let err = fragment_min("knn_x", "knn", None, Some("min_arch"), &bad).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("knn_x") && msg.contains("min_arch") && msg.contains("sm_80"),
            "{msg}"
        );
    }

    #[test]
    fn archs_below_the_minimum_are_dropped() {
        let d = Arch::defaults();
        assert_eq!(archs_for(&d, None), d);
        assert_eq!(archs_for(&d, Some(75)), d);
        assert_eq!(
            archs_for(&d, Some(80)),
            vec![Arch::compute(80), Arch::sm(90)]
        );
        assert_eq!(archs_for(&d, Some(90)), vec![Arch::sm(90)]);
        assert_eq!(check("f", "fam", &d, Some(80)).unwrap().len(), 2);
    }

    #[test]
    fn a_minimum_that_leaves_no_arch_is_an_error_naming_the_fragment() {
        let only75 = [Arch::compute(75)];
        let e = check(
            "knn_tile_f32_tf32_q16_r64_k32",
            "knn_tile",
            &only75,
            Some(80),
        )
        .unwrap_err();
        let msg = e.to_string();
        for part in [
            "knn_tile_f32_tf32_q16_r64_k32",
            "knn_tile",
            "sm_80",
            "compute_75",
        ] {
            assert!(msg.contains(part), "{part} missing: {msg}");
        }
        assert!(check("f", "fam", &only75, None).is_ok());
    }
}

//! Which fragments a search configuration links: chosen from the catalog,
//! so the plan follows the matrices instead of a hard-coded list.

use crate::fragment::FragmentInfo;
use crate::fragments;
use crate::gpu::launch::ScanContract;
use crate::link::prelink::PlanFamily;
use crate::link::Planner;

use super::{DType, Metric};

/// Why no GPU plan exists for a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("k = {k} exceeds the largest top-k capacity of the {dtype}/{idx} scan fragments ({max}); the CPU path handles it where no other GPU path serves it")]
    KTooLarge {
        k: usize,
        max: u32,
        dtype: DType,
        idx: &'static str,
    },
    #[error("no scan fragment for dtype {dtype} with {idx} ids in the catalog")]
    NoScan { dtype: DType, idx: &'static str },
    /// An IVF-Flat index whose list layout (`veclen`, the index's choice
    /// among the powers of two dividing `dim`) no built-in IVF scan reads.
    #[error("no IVF scan fragment reads {dtype} lists of veclen {veclen} (the catalog's ivf_scan variants); the CPU path serves such an index")]
    NoIvfScan { dtype: DType, veclen: usize },
    #[error("fragment `{0}` is not in the catalog")]
    Missing(String),
}

/// The fragments and launch parameters of one GPU scan.
#[derive(Debug, Clone)]
pub struct ScanPlan {
    pub scan: &'static FragmentInfo,
    pub metric: &'static FragmentInfo,
    pub filter: &'static FragmentInfo,
    /// Element type of the rows.
    pub dtype: DType,
    pub veclen: u32,
    pub capacity: u32,
    /// `u32` or `i64` ids.
    pub idx: &'static str,
}

impl ScanPlan {
    /// The planner linking this scan; its entry is the scan fragment.
    pub fn planner(&self) -> Planner {
        Planner::kept(&[self.scan, self.metric, self.filter])
    }

    /// What the chosen scan variant requires of its launch (checked by
    /// the GPU path before launching; the kernel checks it too and writes
    /// nothing when it fails).
    pub fn contract(&self) -> ScanContract {
        ScanContract {
            elem_bytes: self.dtype.size() as u32,
            veclen: self.veclen,
            id_bytes: if self.idx == "i64" { 8 } else { 4 },
            capacity: self.capacity,
        }
    }

    pub fn fragment_names(&self) -> Vec<&'static str> {
        vec![self.scan.name, self.metric.name, self.filter.name]
    }
}

fn param_u32(f: &FragmentInfo, key: &str) -> Option<u32> {
    f.param(key)?.parse().ok()
}

/// The scan for `dtype` with ids of `idx` (u32 while row ids fit, else i64),
/// the widest vector loads `dim` allows (rows must start on a `veclen`
/// boundary), and the smallest top-k capacity holding `k`.
pub fn plan(
    dtype: DType,
    metric: Metric,
    filter: &str,
    n_rows: usize,
    dim: usize,
    k: usize,
) -> Result<ScanPlan, PlanError> {
    // 0xFFFFFFFF is the u32 padding id.
    let idx: &'static str = if n_rows < u32::MAX as usize {
        "u32"
    } else {
        "i64"
    };
    let scans: Vec<&'static FragmentInfo> = fragments::catalog()
        .iter()
        .copied()
        .filter(|f| {
            f.family == "scan"
                && f.param("dtype") == Some(dtype.name())
                && f.param("idx") == Some(idx)
        })
        .collect();
    let max_cap = scans.iter().filter_map(|f| param_u32(f, "capacity")).max();
    let Some(max_cap) = max_cap else {
        return Err(PlanError::NoScan { dtype, idx });
    };
    let capacity = scans
        .iter()
        .filter_map(|f| param_u32(f, "capacity"))
        .filter(|&c| c as usize >= k)
        .min()
        .ok_or(PlanError::KTooLarge {
            k,
            max: max_cap,
            dtype,
            idx,
        })?;
    let scan = scans
        .iter()
        .copied()
        .filter(|f| param_u32(f, "capacity") == Some(capacity))
        .filter(|f| param_u32(f, "veclen").is_some_and(|v| v > 0 && dim.is_multiple_of(v as usize)))
        .max_by_key(|f| param_u32(f, "veclen"))
        .ok_or(PlanError::NoScan { dtype, idx })?;
    let veclen = param_u32(scan, "veclen").unwrap_or(1);
    let metric_name = format!("metric_{}_{}", metric.fragment_name(), dtype.name());
    let filter_name = format!("filter_{filter}_{idx}");
    Ok(ScanPlan {
        scan,
        metric: fragments::find(&metric_name).ok_or(PlanError::Missing(metric_name))?,
        filter: fragments::find(&filter_name).ok_or(PlanError::Missing(filter_name))?,
        dtype,
        veclen,
        capacity,
        idx,
    })
}

/// The filters `plan` accepts (`filter_<this>_<idx>` fragments).
pub const FILTERS: [&str; 2] = ["none", "bitset"];

/// One scan variant with one metric and one filter that fit it.
pub(crate) struct ScanTriple {
    pub scan: &'static FragmentInfo,
    pub metric: &'static FragmentInfo,
    pub filter: &'static FragmentInfo,
    pub dtype: DType,
    pub veclen: u32,
    pub capacity: u32,
}

/// Every scan fragment of `family` that `keep` accepts, with each built-in
/// metric of its dtype and each filter of `FILTERS` for ids of `idx_of(scan)`
/// (variants without a dtype, veclen or capacity, or without those fragments
/// in the catalog, are skipped). The enumerators of the scan families.
pub(crate) fn scan_triples(
    family: &str,
    keep: impl Fn(&FragmentInfo) -> bool,
    idx_of: impl Fn(&FragmentInfo) -> Option<&'static str>,
) -> Vec<ScanTriple> {
    let mut out = Vec::new();
    for scan in fragments::catalog().iter().copied() {
        if scan.family != family || !keep(scan) {
            continue;
        }
        let (Some(dtype), Some(idx), Some(veclen), Some(capacity)) = (
            scan.param("dtype").and_then(|d| d.parse::<DType>().ok()),
            idx_of(scan),
            param_u32(scan, "veclen"),
            param_u32(scan, "capacity"),
        ) else {
            continue;
        };
        for metric in Metric::ALL {
            for filter in FILTERS {
                let metric = fragments::find(&format!(
                    "metric_{}_{}",
                    metric.fragment_name(),
                    dtype.name()
                ));
                let filter = fragments::find(&format!("filter_{filter}_{idx}"));
                if let (Some(metric), Some(filter)) = (metric, filter) {
                    out.push(ScanTriple {
                        scan,
                        metric,
                        filter,
                        dtype,
                        veclen,
                        capacity,
                    });
                }
            }
        }
    }
    out
}

/// Every scan plan [`plan`] can produce: each scan variant of the catalog
/// (any veclen is chosen for some `dim`, any capacity for some `k`, u32 or
/// i64 ids for some row count) with each metric of its dtype and each
/// filter of its id type. Follows the catalog, like `plan` itself.
pub fn all_plans() -> Vec<ScanPlan> {
    let idx = |s: &FragmentInfo| {
        s.param("idx")
            .and_then(|i| ["u32", "i64"].into_iter().find(|&x| x == i))
    };
    scan_triples("scan", |_| true, idx)
        .into_iter()
        .map(|t| ScanPlan {
            idx: idx(t.scan).expect("kept only with an idx"),
            scan: t.scan,
            metric: t.metric,
            filter: t.filter,
            dtype: t.dtype,
            veclen: t.veclen,
            capacity: t.capacity,
        })
        .collect()
}

/// The exact k-NN scan family, for prelinking (`fraglink prelink --family scan`).
pub const SCAN_FAMILY: PlanFamily = PlanFamily::new(
    "scan",
    "exact k-NN scans: scan variant x metric x filter, as `fraglink search` plans them",
    || all_plans().iter().map(ScanPlan::planner).collect(),
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The enumerator and the planner rules agree: every plan `plan` makes
    /// is enumerated, and every enumerated plan is made by `plan` for some
    /// input.
    #[test]
    fn all_plans_are_exactly_the_reachable_plans() {
        let mut reached = Vec::new();
        for dtype in DType::ALL {
            for metric in Metric::ALL {
                for filter in FILTERS {
                    for rows in [1000, u32::MAX as usize + 1] {
                        for dim in [1, 2, 4, 8, 16, 32, 7, 12, 24, 48] {
                            for k in [1, 10, 32, 33, 64, 100, 128, 200, 256] {
                                if let Ok(p) = plan(dtype, metric, filter, rows, dim, k) {
                                    reached.push(p.planner());
                                }
                            }
                        }
                    }
                }
            }
        }
        SCAN_FAMILY.check_against(reached).unwrap();
        assert_eq!(SCAN_FAMILY.plans().len(), all_plans().len());
    }

    #[test]
    fn picks_widest_veclen_and_smallest_capacity() {
        let p = plan(DType::F32, Metric::L2, "none", 1000, 128, 10).unwrap();
        assert_eq!(
            p.fragment_names(),
            ["scan_f32_u32_v4_k32", "metric_l2_f32", "filter_none_u32"]
        );
        let p = plan(DType::F32, Metric::Cosine, "bitset", 1000, 129, 100).unwrap();
        assert_eq!(
            p.fragment_names(),
            [
                "scan_f32_u32_v1_k128",
                "metric_cosine_f32",
                "filter_bitset_u32"
            ]
        );
        let p = plan(DType::U8, Metric::InnerProduct, "none", 10, 32, 256).unwrap();
        assert_eq!(p.fragment_names()[0], "scan_u8_u32_v16_k256");
        let p = plan(DType::F16, Metric::L2, "none", u32::MAX as usize + 5, 8, 1).unwrap();
        assert_eq!(
            p.fragment_names(),
            ["scan_f16_i64_v8_k32", "metric_l2_f16", "filter_none_i64"]
        );
    }

    #[test]
    fn the_contract_follows_the_chosen_variant() {
        let c = plan(DType::F16, Metric::L2, "none", 1000, 64, 100)
            .unwrap()
            .contract();
        assert_eq!(
            (c.elem_bytes, c.veclen, c.id_bytes, c.capacity),
            (2, 8, 4, 128)
        );
        assert_eq!(c.vector_align(), 16);
        // The plan's own choice always passes its contract.
        for (dtype, dim) in [(DType::F32, 129), (DType::I8, 48), (DType::U8, 7)] {
            let p = plan(dtype, Metric::L2, "none", 1000, dim, 10).unwrap();
            assert_eq!(p.dtype, dtype);
            p.contract().scalars(1000, dim as u64, 3, 10).unwrap();
        }
        let wide = plan(DType::U8, Metric::L2, "none", u32::MAX as usize, 16, 1).unwrap();
        assert_eq!(wide.contract().id_bytes, 8);
        assert!(wide.contract().scalars(u32::MAX as u64, 16, 1, 1).is_ok());
    }

    #[test]
    fn k_beyond_capacity_is_an_error() {
        let e = plan(DType::I8, Metric::L2, "none", 10, 16, 257).unwrap_err();
        assert!(e.to_string().contains("256"), "{e}");
    }
}

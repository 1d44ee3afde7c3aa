//! The plan families shipped with fraglink, for prelinking
//! (`fraglink prelink --family NAME | --all`). A new family declares its
//! [`PlanFamily`] next to its planner rules and is listed here once.

use crate::link::prelink::PlanFamily;

/// Every shipped family.
pub const PLAN_FAMILIES: &[PlanFamily] = &[
    crate::search::plan::SCAN_FAMILY,
    crate::search::ivf::gpu::IVF_SCAN_FAMILY,
    crate::search::knn::KNN_FAMILY,
    crate::search::knn::SELECT_FAMILY,
];

/// The family called `name`.
pub fn find(name: &str) -> Option<&'static PlanFamily> {
    PLAN_FAMILIES.iter().find(|f| f.name == name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_unique_and_found() {
        for f in super::PLAN_FAMILIES {
            assert_eq!(super::find(f.name).unwrap().name, f.name);
            let same = super::PLAN_FAMILIES.iter().filter(|g| g.name == f.name);
            assert_eq!(same.count(), 1, "{} is listed twice", f.name);
            assert!(!f.plans().is_empty(), "{} has no plans", f.name);
        }
        assert!(super::find("nope").is_none());
    }
}

//! The plan check: what nvJitLink would reject (or silently mis-link) is
//! refused before it runs, from what the build recorded
//! ([`FragmentInfo::entries`], [`FragmentInfo::definitions`]), with
//! messages that say what to change:
//!
//! * a fragment given twice ("symbol multiply defined" from nvJitLink);
//! * two fragments defining one external symbol, named demangled;
//! * no entry, an empty entry, or an entry no fragment has, with the
//!   nearest names; and an entry the fragment has only in another arch's
//!   IR: a `#if __CUDA_ARCH__` guard removed it from the IR chosen here.
//!
//! Run-time sources record nothing, so with a source in the plan an entry
//! not found in the embedded fragments is left to nvJitLink.

use std::collections::BTreeMap;

use crate::build::arch::Arch;
use crate::fragment::FragmentInfo;

use super::demangle::describe;
use super::planner::Planner;
use super::LinkError;

/// The arch whose IR nvJitLink uses for `target` from a fragment.
fn chosen(info: &FragmentInfo, target: Arch) -> Option<Arch> {
    let built: Vec<Arch> = info
        .archs
        .iter()
        .filter_map(|a| Arch::parse(a, "catalog").ok())
        .collect();
    Arch::chosen_for(&built, target)
}

/// Checks `plan` for `target` (a real arch); see the module documentation.
pub fn check_plan(plan: &Planner, target: Arch) -> Result<(), LinkError> {
    let names = plan.fragment_names();
    for (i, n) in names.iter().enumerate() {
        if names[..i].contains(n) {
            return Err(LinkError::DuplicateFragment { name: n.clone() });
        }
    }
    let entries = plan.entries();
    if entries.is_empty() {
        return Err(LinkError::NoEntry);
    }
    if let Some(bad) = entries.iter().find(|e| !valid_symbol(e)) {
        return Err(LinkError::EmptyEntry { entry: bad.clone() });
    }
    let statics = plan.static_fragments();
    // Strong definitions shared by two fragments.
    let mut owner: BTreeMap<&str, &str> = BTreeMap::new();
    for f in statics {
        for d in f.definitions {
            if let Some(first) = owner.insert(d, f.name) {
                return Err(LinkError::DuplicateDefinition {
                    symbol: describe(d),
                    first: first.to_string(),
                    second: f.name.to_string(),
                });
            }
        }
    }
    // Every entry in the IR chosen for this target.
    let chosen_lists: Vec<(&FragmentInfo, Option<Arch>, &[&str])> = statics
        .iter()
        .map(|f| {
            let arch = chosen(f, target);
            let list = arch
                .and_then(|a| f.entries_for(&a.to_string()))
                .unwrap_or(&[]);
            (*f, arch, list)
        })
        .collect();
    for entry in entries {
        if chosen_lists
            .iter()
            .any(|(_, _, l)| l.contains(&entry.as_str()))
        {
            continue;
        }
        // In another arch's IR of some fragment: an arch guard removed it.
        for (f, arch, _) in &chosen_lists {
            let present: Vec<&str> = f
                .entries
                .iter()
                .filter(|(_, l)| l.contains(&entry.as_str()))
                .map(|(a, _)| *a)
                .collect();
            if !present.is_empty() {
                return Err(LinkError::EntryGuarded {
                    entry: describe(entry),
                    fragment: f.name.to_string(),
                    target: target.to_string(),
                    chosen: arch.map_or_else(|| "no IR".to_string(), |a| a.to_string()),
                    present_in: present.join(", "),
                });
            }
        }
        if !plan.sources().is_empty() {
            continue;
        }
        let known: Vec<&str> = chosen_lists
            .iter()
            .flat_map(|(_, _, l)| l.iter().copied())
            .collect();
        return Err(LinkError::UnknownEntry {
            entry: entry.clone(),
            target: target.to_string(),
            fragments: statics
                .iter()
                .map(|f| f.name)
                .collect::<Vec<_>>()
                .join(", "),
            nearest: crate::fragment::nearest(&known, entry, 3)
                .into_iter()
                .map(describe)
                .collect(),
        });
    }
    Ok(())
}

/// A symbol nvJitLink can be asked for: not empty, no whitespace or
/// control characters.
fn valid_symbol(s: &str) -> bool {
    !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

//! The planner: which fragments one kernel needs, and with which options.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::build::arch::Arch;
use crate::fragment::{FragmentInfo, StaticFragment};

use super::linker::{FastCompile, LinkOptions};
use super::memo::KeyMemo;
use super::runtime::{LinkRuntime, Linked};
use super::LinkError;

/// Most plans [`Planner::kept`] keeps.
pub const KEPT_PLANNERS: usize = 256;

/// A plan's link settings, as [`Planner::settings`] returns them and a
/// profile ([`super::profile`]) records them. `None`: nvJitLink's default.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSettings {
    pub opt_level: u8,
    pub lineinfo: bool,
    pub max_registers: Option<u32>,
    pub split_compile: Option<u32>,
    /// `None`: the runtime's default ([`LinkRuntime`]: `FRAGLINK_FAST_COMPILE`
    /// for the process-wide one, full optimisation otherwise).
    #[serde(default)]
    pub fast_compile: Option<FastCompile>,
    pub ftz: Option<bool>,
    pub prec_div: Option<bool>,
    pub prec_sqrt: Option<bool>,
    pub fma: Option<bool>,
}

impl Default for PlanSettings {
    /// `-O3`, everything else nvJitLink's default.
    fn default() -> Self {
        PlanSettings {
            opt_level: 3,
            lineinfo: false,
            max_registers: None,
            split_compile: None,
            fast_compile: None,
            ftz: None,
            prec_div: None,
            prec_sqrt: None,
            fma: None,
        }
    }
}

/// A link plan: its entry points (one link serves them all) and its
/// fragments, in link order.
#[derive(Debug, Clone)]
pub struct Planner {
    entries: Vec<String>,
    statics: Vec<&'static FragmentInfo>,
    sources: Vec<(String, String)>,
    settings: PlanSettings,
    /// The link key per (runtime, arch), shared by clones of an unchanged
    /// plan; every builder method starts a new one.
    memo: Arc<KeyMemo>,
}

impl Planner {
    /// A plan for the kernel whose symbol is `entry`.
    pub fn new(entry: impl Into<String>) -> Self {
        Self::empty().with_entry(entry)
    }

    /// A plan with no entry yet (add them with [`with_entry`](Self::with_entry)
    /// or [`kernel`](Self::kernel)).
    pub fn empty() -> Self {
        Planner {
            entries: Vec::new(),
            statics: Vec::new(),
            sources: Vec::new(),
            settings: PlanSettings::default(),
            memo: Arc::default(),
        }
    }

    /// Called by every builder method: the plan changes, so a key
    /// remembered for its previous content (perhaps shared with a clone)
    /// no longer applies.
    fn changed(mut self) -> Self {
        self.memo = Arc::default();
        self
    }

    pub(crate) fn memo(&self) -> &KeyMemo {
        &self.memo
    }

    /// One more kernel for the same link (`-kernels-used` takes several):
    /// a 100-kernel file is one link, not 100. A repeated entry is kept once.
    pub fn with_entry(mut self, entry: impl Into<String>) -> Self {
        let e = entry.into();
        if !self.entries.contains(&e) {
            self.entries.push(e);
        }
        self.changed()
    }

    /// Adds an embedded fragment chosen at compile time; a combination the
    /// matrices did not produce does not compile.
    pub fn add<F: StaticFragment>(self) -> Self {
        self.add_fragment(F::info())
    }

    /// Adds the kernel fragment `F` names by the C++ name expression
    /// `expression` (`"quantize<float>"`, as rendered by the family's
    /// `name_expression`): its mangled name, recorded at build time, becomes
    /// an entry, and `F` is added unless it is in the plan already.
    pub fn kernel<F: StaticFragment>(self, expression: &str) -> Result<Self, LinkError> {
        self.kernel_of(F::info(), expression)
    }

    /// [`kernel`](Self::kernel) for a fragment chosen at run time (e.g. from
    /// [`find_in`](crate::fragment::find_in)).
    pub fn kernel_of(
        mut self,
        info: &'static FragmentInfo,
        expression: &str,
    ) -> Result<Self, LinkError> {
        let lowered =
            info.lowered_name(expression)
                .ok_or_else(|| LinkError::UnknownExpression {
                    fragment: info.name.to_string(),
                    expression: expression.to_string(),
                    known: info.lowered.iter().map(|(e, _)| e.to_string()).collect(),
                })?;
        if !self.statics.iter().any(|f| std::ptr::eq(*f, info)) {
            self.statics.push(info);
        }
        // `with_entry` starts a new memo for the changed plan.
        Ok(self.with_entry(lowered))
    }

    /// Adds an embedded fragment by description (any catalog).
    pub fn add_fragment(mut self, info: &'static FragmentInfo) -> Self {
        self.statics.push(info);
        self.changed()
    }

    /// The plan of `fragments` (the first names the entry), one per
    /// process: kept in a map by the fragments' names (at most
    /// [`KEPT_PLANNERS`], cleared when full), so that a search asking again
    /// gets a planner that remembers its link key (`link::memo`), which a
    /// planner built afresh hashes again. Linking a k-NN search's pair from
    /// fresh planners took 6.1-6.5 µs (memory-cache hits, f32 nq 1 k 10 for
    /// sm_90, 2-core VM, release, 5000 calls), from kept ones 0.36 µs;
    /// building the two 0.53 µs.
    pub fn kept(fragments: &[&'static FragmentInfo]) -> Planner {
        type Kept = HashMap<Vec<&'static str>, Planner>;
        static KEPT: Mutex<Option<Kept>> = Mutex::new(None);
        let names: Vec<&'static str> = fragments.iter().map(|f| f.name).collect();
        let mut guard = KEPT.lock().unwrap_or_else(|p| p.into_inner());
        let kept = guard.get_or_insert_with(Default::default);
        if let Some(p) = kept.get(&names) {
            return p.clone();
        }
        if kept.len() >= KEPT_PLANNERS {
            kept.clear();
        }
        let p = Planner::of_fragments(fragments);
        kept.insert(names, p.clone());
        p
    }

    /// The plan of `fragments`, whose first names the entry, built anew
    /// (listings of every plan use it: they would only churn
    /// [`Planner::kept`]'s map).
    pub fn of_fragments(fragments: &[&'static FragmentInfo]) -> Planner {
        let entry = fragments.first().map_or("", |f| f.name);
        fragments
            .iter()
            .fold(Planner::new(entry), |p, f| p.add_fragment(f))
    }

    /// Adds one of fraglink's own fragments by name, for configurations
    /// chosen at run time. An unknown name lists the nearest ones.
    pub fn add_named(self, name: &str) -> Result<Self, LinkError> {
        self.add_named_in(&crate::fragments::CATALOG, name)
    }

    /// Like [`Planner::add_named`], in another crate's catalog.
    pub fn add_named_in(
        self,
        catalog: &'static [&'static FragmentInfo],
        name: &str,
    ) -> Result<Self, LinkError> {
        match crate::fragment::find_in(catalog, name) {
            Some(info) => Ok(self.add_fragment(info)),
            None => Err(LinkError::UnknownFragment {
                name: name.to_string(),
                nearest: crate::fragment::nearest_names(catalog, name, 3)
                    .into_iter()
                    .map(String::from)
                    .collect(),
            }),
        }
    }

    /// Adds a user-defined fragment, compiled by NVRTC to LTO-IR at run time
    /// (once per content, arch and NVRTC version). It may include fraglink's
    /// fragment headers and CUDA's (`cuda_fp16.h`, `cuda/std/...`).
    pub fn add_source(mut self, name: impl Into<String>, cuda_source: impl Into<String>) -> Self {
        self.sources.push((name.into(), cuda_source.into()));
        self.changed()
    }

    /// The optimisation level, 0 … 3 (above 3 is 3). 0 links at `-O0`
    /// (about a third of the time, and much slower code: a tile kernel
    /// gets a stack frame); 1 and 2 keep the LTO optimiser at `-O3` and
    /// lower only ptxas's level ([`LinkOptions::opt_level`]).
    pub fn opt_level(mut self, level: u8) -> Self {
        self.settings.opt_level = level.min(3);
        self.changed()
    }
    pub fn lineinfo(mut self, on: bool) -> Self {
        self.settings.lineinfo = on;
        self.changed()
    }
    pub fn max_registers(mut self, n: u32) -> Self {
        self.settings.max_registers = Some(n);
        self.changed()
    }
    pub fn split_compile(mut self, threads: u32) -> Self {
        self.settings.split_compile = Some(threads);
        self.changed()
    }
    /// nvJitLink's fast-compile level ([`FastCompile`]): a shorter link for
    /// slower code; it stands for the optimisation level where it is not
    /// [`FastCompile::Off`].
    pub fn fast_compile(mut self, level: FastCompile) -> Self {
        self.settings.fast_compile = Some(level);
        self.changed()
    }
    pub fn ftz(mut self, on: bool) -> Self {
        self.settings.ftz = Some(on);
        self.changed()
    }
    pub fn prec_div(mut self, on: bool) -> Self {
        self.settings.prec_div = Some(on);
        self.changed()
    }
    pub fn prec_sqrt(mut self, on: bool) -> Self {
        self.settings.prec_sqrt = Some(on);
        self.changed()
    }
    pub fn fma(mut self, on: bool) -> Self {
        self.settings.fma = Some(on);
        self.changed()
    }

    /// The first entry ("" when there is none).
    pub fn entry(&self) -> &str {
        self.entries.first().map_or("", String::as_str)
    }
    /// Every entry, in the order given.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }
    pub fn static_fragments(&self) -> &[&'static FragmentInfo] {
        &self.statics
    }
    pub fn sources(&self) -> &[(String, String)] {
        &self.sources
    }
    pub fn is_empty(&self) -> bool {
        self.statics.is_empty() && self.sources.is_empty()
    }
    /// Names of every fragment, in link order.
    pub fn fragment_names(&self) -> Vec<String> {
        self.statics
            .iter()
            .map(|f| f.name.to_string())
            .chain(self.sources.iter().map(|(n, _)| n.clone()))
            .collect()
    }

    /// The nvJitLink options for `arch`.
    pub fn options(&self, arch: Arch) -> LinkOptions {
        let s = &self.settings;
        let mut o = LinkOptions::new(arch);
        o.opt_level = s.opt_level;
        o.lineinfo = s.lineinfo;
        o.max_registers = s.max_registers;
        o.split_compile = s.split_compile;
        o.fast_compile = s.fast_compile;
        o.ftz = s.ftz;
        o.prec_div = s.prec_div;
        o.prec_sqrt = s.prec_sqrt;
        o.fma = s.fma;
        o.kernels_used = self.entries.clone();
        o
    }

    /// The link settings (everything but the entries and the fragments).
    pub fn settings(&self) -> &PlanSettings {
        &self.settings
    }

    /// This plan with `settings` applied (the inverse of [`settings`](Self::settings)).
    pub fn with_settings(mut self, settings: &PlanSettings) -> Self {
        self.settings = settings.clone();
        self.settings.opt_level = settings.opt_level.min(3);
        self.changed()
    }

    /// Links for `arch` through the process-wide runtime.
    pub fn link_for(&self, arch: Arch) -> Result<Linked, LinkError> {
        LinkRuntime::global()?.link(self, arch)
    }

    /// Links for a launch now on `arch` through the process-wide runtime
    /// ([`LinkRuntime::link_tiered`]): a cold plan's first call gets a quick
    /// link (no LTO) while the optimised one runs in the background; ask
    /// again per launch to move to it. The search paths link so.
    pub fn link_tiered_for(&self, arch: Arch) -> Result<Linked, LinkError> {
        LinkRuntime::global()?.link_tiered(self, arch)
    }

    /// Links two plans for `arch` through the process-wide runtime, both at
    /// the same time when neither is in memory yet
    /// ([`LinkRuntime::link_all`]): a search's kernel pair.
    pub fn link_pair_for(
        first: &Planner,
        second: &Planner,
        arch: Arch,
    ) -> Result<(Linked, Linked), LinkError> {
        Self::pair(LinkRuntime::global()?.link_all(&[first, second], arch)?)
    }

    /// [`link_pair_for`](Self::link_pair_for) for a launch now
    /// ([`LinkRuntime::link_all_tiered`]): quick links where they serve
    /// (the search paths link so, per search).
    pub fn link_pair_tiered_for(
        first: &Planner,
        second: &Planner,
        arch: Arch,
    ) -> Result<(Linked, Linked), LinkError> {
        Self::pair(LinkRuntime::global()?.link_all_tiered(&[first, second], arch)?)
    }

    fn pair(links: Vec<Linked>) -> Result<(Linked, Linked), LinkError> {
        let mut both = links.into_iter();
        match (both.next(), both.next()) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => unreachable!("link_all returns one link per plan"),
        }
    }

    /// Links for `arch` through `runtime`.
    pub fn link_with(&self, runtime: &LinkRuntime, arch: Arch) -> Result<Linked, LinkError> {
        runtime.link(self, arch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_name_lists_nearest() {
        let e = Planner::new("x")
            .add_named("metric_l2_f33")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown fragment `metric_l2_f33`"), "{e}");
        assert!(e.contains("metric_l2_f32"), "{e}");
    }

    #[test]
    fn options_carry_the_entry_and_settings() {
        let p = Planner::new("scan_f32_u32_v4_k128")
            .add_named("scan_f32_u32_v4_k128")
            .unwrap()
            .max_registers(64)
            .lineinfo(true);
        assert_eq!(
            p.options(Arch::sm(80)).to_args().join(" "),
            "-lto -arch=sm_80 -O3 -verbose -lineinfo -maxrregcount=64 -kernels-used=scan_f32_u32_v4_k128"
        );
        assert_eq!(p.fragment_names(), ["scan_f32_u32_v4_k128"]);
    }

    #[test]
    fn several_entries_in_one_plan() {
        let p = Planner::new("a").with_entry("b").with_entry("a");
        assert_eq!(p.entries(), ["a", "b"]);
        assert_eq!(p.entry(), "a");
        assert_eq!(
            p.options(Arch::sm(90)).kernels_used,
            ["a".to_string(), "b".to_string()]
        );
        assert_eq!(Planner::empty().entry(), "");
    }
}

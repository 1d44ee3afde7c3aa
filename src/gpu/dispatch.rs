//! Dispatch strategy per kernel family: launch directly, or capture the
//! call's launches into a CUDA graph once and replay it.
//!
//! The axis is the kernel family, not the device or the input size alone:
//! each family registers [`KernelCharacteristics`] once, and
//! [`DispatchRegistry::decide`] turns them, the amount of work of one call
//! and any override into a [`Decision`] that says which strategy and why.
//!
//! ## Rules, in order
//!
//! 1. **Override.** `FRAGLINK_CUDA_DISPATCH=family:graph,other:direct` (or
//!    [`DispatchRegistry::with_overrides`]) wins; `*:strategy` applies to
//!    every family without an entry of its own.
//! 2. **Unregistered family** → `Direct`, CUDA's default.
//! 3. **Hint.** A family's own `hint` is taken as given.
//! 4. **Single dispatch.** Fewer than [`DispatchPolicy::min_graph_dispatches`]
//!    launches per call (default 2) → `Direct`: replaying a graph costs
//!    about one launch, so there is nothing to amortise.
//! 5. **Reduction only** → `Direct`: the work of a pure reduction grows
//!    with its input and dominates the fixed per-launch overhead.
//! 6. **Too little work.** `work < min_useful_work` (the family's, or
//!    [`DispatchPolicy::default_min_useful_work`] when it gives 0) →
//!    `Direct`: for families whose own measurements show that below that
//!    size capture and replay do not pay off. The default policy has no
//!    such threshold (0): on an H100 (driver 580.159.04, CUDA 13.0, GPU.md
//!    at commit 8b2d061) replaying a captured graph beat direct launches
//!    of a tiny scan at every batch from 1 to 256 launches per call, by
//!    30–35 %, and capture plus instantiation paid for itself within 2–5
//!    replays from 2 launches on (48 for a single launch, hence rule 4).
//!    SYCL's frame-area threshold, which the libvmaf ADR migrates into its
//!    registry, is a property of that backend, not of CUDA graphs.
//! 7. Otherwise → `GraphCapture`.
//!
//! "Work" is whatever unit the family measures one call in (elements,
//! rows × queries, pixels); the family's `min_useful_work` uses the same.
//!
//! The override grammar: comma-separated `family:strategy` entries,
//! whitespace around tokens ignored, empty entries skipped; strategies
//! `direct` and `graph` (also `graph_capture`, `graph-capture`, `capture`),
//! case-insensitive; family names of letters, digits, `_`, `-`, `.`, or
//! `*`. Naming one family twice with different strategies is an error.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use once_cell::sync::OnceCell;

use super::{driver_error, GpuError, GpuResult};

/// The environment variable with per-family overrides.
pub const DISPATCH_ENV: &str = "FRAGLINK_CUDA_DISPATCH";

/// How one call of a kernel family reaches the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispatchStrategy {
    /// Each launch is issued as it comes (`cuLaunchKernel`).
    Direct,
    /// The call's launches are captured into a CUDA graph once and the graph
    /// is replayed (`cuGraphLaunch`).
    GraphCapture,
}

impl DispatchStrategy {
    /// The canonical names, as the override accepts and prints them.
    pub const NAMES: &'static [&'static str] = &["direct", "graph"];

    pub fn name(self) -> &'static str {
        match self {
            DispatchStrategy::Direct => "direct",
            DispatchStrategy::GraphCapture => "graph",
        }
    }

    /// Case-insensitive; `graph_capture`, `graph-capture` and `capture` are
    /// accepted for `graph`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "direct" => Some(DispatchStrategy::Direct),
            "graph" | "graph_capture" | "graph-capture" | "capture" => {
                Some(DispatchStrategy::GraphCapture)
            }
            _ => None,
        }
    }
}

impl fmt::Display for DispatchStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DispatchStrategy {
    type Err = OverrideErrorKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DispatchStrategy::parse(s).ok_or_else(|| OverrideErrorKind::UnknownStrategy {
            given: s.trim().to_owned(),
            known: DispatchStrategy::NAMES.to_vec(),
        })
    }
}

/// What a kernel family's calls look like to the dispatcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelCharacteristics {
    /// Kernel launches one call issues.
    pub dispatches_per_call: u32,
    /// The call is a pure reduction over its input.
    pub reduction_only: bool,
    /// Work per call from which graph replay pays off; 0 = use the policy's
    /// default.
    pub min_useful_work: u64,
    /// The family's own choice, taken as given (rule 3).
    pub hint: Option<DispatchStrategy>,
}

/// Thresholds of the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchPolicy {
    /// Fewest launches per call for which graph replay is considered.
    pub min_graph_dispatches: u32,
    /// `min_useful_work` of families that leave it at 0.
    pub default_min_useful_work: u64,
}

impl Default for DispatchPolicy {
    fn default() -> Self {
        DispatchPolicy {
            min_graph_dispatches: 2,
            // No work threshold by default: see rule 6 in the module docs.
            default_min_useful_work: 0,
        }
    }
}

/// Which rule produced a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecisionSource {
    Override,
    Unregistered,
    Hint,
    Rule,
}

/// A strategy and the reason for it, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub strategy: DispatchStrategy,
    pub source: DecisionSource,
    pub reason: String,
}

/// Why an override string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideErrorKind {
    #[error("expected `family:strategy`")]
    MissingSeparator,
    #[error("the family name is empty")]
    EmptyFamily,
    #[error("family name `{0}` may only contain letters, digits, `_`, `-` and `.`, or be `*`")]
    InvalidFamily(String),
    #[error("unknown strategy `{given}` (known: {})", .known.join(", "))]
    UnknownStrategy {
        given: String,
        known: Vec<&'static str>,
    },
    #[error("`{family}` is set to both {first} and {second}")]
    Conflict {
        family: String,
        first: DispatchStrategy,
        second: DispatchStrategy,
    },
}

/// An override string error, naming the offending entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{DISPATCH_ENV}: bad entry `{token}`: {kind}")]
pub struct OverrideError {
    /// The entry as written (trimmed).
    pub token: String,
    pub kind: OverrideErrorKind,
}

/// Parsed per-family overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchOverrides {
    entries: Vec<(String, DispatchStrategy)>,
}

impl DispatchOverrides {
    /// The override for `family`: its own entry, else the `*` entry.
    pub fn get(&self, family: &str) -> Option<DispatchStrategy> {
        self.find(family).or_else(|| self.find("*"))
    }

    fn find(&self, family: &str) -> Option<DispatchStrategy> {
        self.entries
            .iter()
            .find(|(f, _)| f == family)
            .map(|(_, s)| *s)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries in the order written (duplicates removed).
    pub fn iter(&self) -> impl Iterator<Item = (&str, DispatchStrategy)> {
        self.entries.iter().map(|(f, s)| (f.as_str(), *s))
    }

    /// Sets (or replaces) one override.
    pub fn set(&mut self, family: &str, strategy: DispatchStrategy) {
        match self.entries.iter_mut().find(|(f, _)| f == family) {
            Some(e) => e.1 = strategy,
            None => self.entries.push((family.to_owned(), strategy)),
        }
    }
}

fn valid_family(name: &str) -> bool {
    name == "*"
        || name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// Parses `family:strategy[,family:strategy…]` (see the module docs).
pub fn parse_override(text: &str) -> Result<DispatchOverrides, OverrideError> {
    let mut out = DispatchOverrides::default();
    for raw in text.split(',') {
        let token = raw.trim();
        if token.is_empty() {
            continue;
        }
        let err = |kind| OverrideError {
            token: token.to_owned(),
            kind,
        };
        let (family, strategy) = token
            .split_once(':')
            .ok_or_else(|| err(OverrideErrorKind::MissingSeparator))?;
        let (family, strategy) = (family.trim(), strategy.trim());
        if family.is_empty() {
            return Err(err(OverrideErrorKind::EmptyFamily));
        }
        if !valid_family(family) {
            return Err(err(OverrideErrorKind::InvalidFamily(family.to_owned())));
        }
        let strategy: DispatchStrategy = strategy.parse().map_err(err)?;
        match out.find(family) {
            Some(first) if first != strategy => {
                return Err(err(OverrideErrorKind::Conflict {
                    family: family.to_owned(),
                    first,
                    second: strategy,
                }))
            }
            Some(_) => {}
            None => out.entries.push((family.to_owned(), strategy)),
        }
    }
    Ok(out)
}

/// The decision for a family with `chars` (None = unregistered), an
/// optional override, and `work` per call. Pure; see the module docs.
pub fn decide_with(
    family: &str,
    chars: Option<&KernelCharacteristics>,
    override_: Option<DispatchStrategy>,
    policy: &DispatchPolicy,
    work: u64,
) -> Decision {
    let decision = |strategy, source, reason: String| Decision {
        strategy,
        source,
        reason,
    };
    if let Some(s) = override_ {
        return decision(
            s,
            DecisionSource::Override,
            format!("{DISPATCH_ENV} sets `{family}` to {s}"),
        );
    }
    let Some(c) = chars else {
        return decision(
            DispatchStrategy::Direct,
            DecisionSource::Unregistered,
            format!(
                "no characteristics registered for `{family}`: direct launch, the CUDA default"
            ),
        );
    };
    if let Some(h) = c.hint {
        return decision(h, DecisionSource::Hint, format!("`{family}` asks for {h}"));
    }
    let direct = |reason: String| decision(DispatchStrategy::Direct, DecisionSource::Rule, reason);
    if c.dispatches_per_call < policy.min_graph_dispatches {
        return direct(format!(
            "`{family}` issues {} launch(es) per call, fewer than {}: a graph replay would cost as much as the launches it replaces",
            c.dispatches_per_call, policy.min_graph_dispatches
        ));
    }
    if c.reduction_only {
        return direct(format!(
            "`{family}` is a pure reduction: its work grows with the input and outweighs the launch overhead"
        ));
    }
    let threshold = if c.min_useful_work == 0 {
        policy.default_min_useful_work
    } else {
        c.min_useful_work
    };
    if work < threshold {
        return direct(format!(
            "work {work} of `{family}` is below the graph threshold {threshold}"
        ));
    }
    decision(
        DispatchStrategy::GraphCapture,
        DecisionSource::Rule,
        format!(
            "`{family}` issues {} launches per call{}: replaying a captured graph saves {} launch overheads",
            c.dispatches_per_call,
            if threshold == 0 {
                String::new()
            } else {
                format!(" on work {work} ≥ {threshold}")
            },
            c.dispatches_per_call - 1
        ),
    )
}

/// The families fraglink itself launches, with their characteristics.
pub const BUILTIN_FAMILIES: &[(&str, KernelCharacteristics)] = &[(
    // The vector-search scan: one block-wide top-k kernel per call.
    "scan",
    KernelCharacteristics {
        dispatches_per_call: 1,
        reduction_only: false,
        min_useful_work: 0,
        hint: None,
    },
)];

/// Per-family characteristics plus overrides; thread-safe.
#[derive(Debug, Default)]
pub struct DispatchRegistry {
    families: RwLock<HashMap<String, KernelCharacteristics>>,
    overrides: DispatchOverrides,
    policy: DispatchPolicy,
}

impl DispatchRegistry {
    /// An empty registry with `policy` and no overrides.
    pub fn new(policy: DispatchPolicy) -> Self {
        DispatchRegistry {
            families: RwLock::new(HashMap::new()),
            overrides: DispatchOverrides::default(),
            policy,
        }
    }

    /// The default policy and [`BUILTIN_FAMILIES`], no overrides.
    pub fn with_builtin() -> Self {
        let r = Self::new(DispatchPolicy::default());
        for (name, chars) in BUILTIN_FAMILIES {
            r.register(name, *chars);
        }
        r
    }

    /// [`Self::with_builtin`] plus the overrides of [`DISPATCH_ENV`] (if set).
    pub fn from_env() -> GpuResult<Self> {
        let overrides = match std::env::var(DISPATCH_ENV) {
            Ok(text) => parse_override(&text)?,
            Err(std::env::VarError::NotPresent) => DispatchOverrides::default(),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(GpuError::invalid_config(format!(
                    "{DISPATCH_ENV} is not valid UTF-8"
                )))
            }
        };
        Ok(Self::with_builtin().with_overrides(overrides))
    }

    /// The process-wide registry, built from the environment on first use.
    /// A malformed [`DISPATCH_ENV`] is reported on every call.
    pub fn global() -> GpuResult<&'static DispatchRegistry> {
        static GLOBAL: OnceCell<Result<DispatchRegistry, GpuError>> = OnceCell::new();
        GLOBAL
            .get_or_init(Self::from_env)
            .as_ref()
            .map_err(Clone::clone)
    }

    pub fn with_overrides(mut self, overrides: DispatchOverrides) -> Self {
        self.overrides = overrides;
        self
    }

    pub fn overrides(&self) -> &DispatchOverrides {
        &self.overrides
    }

    pub fn policy(&self) -> &DispatchPolicy {
        &self.policy
    }

    /// Registers (or replaces) a family's characteristics.
    pub fn register(&self, family: &str, chars: KernelCharacteristics) {
        self.families
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(family.to_owned(), chars);
    }

    pub fn characteristics(&self, family: &str) -> Option<KernelCharacteristics> {
        self.families
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(family)
            .copied()
    }

    /// The strategy for one call of `family` doing `work`.
    pub fn decide(&self, family: &str, work: u64) -> Decision {
        let chars = self.characteristics(family);
        decide_with(
            family,
            chars.as_ref(),
            self.overrides.get(family),
            &self.policy,
            work,
        )
    }
}

const CAPTURE_FLAGS: CUgraphInstantiate_flags =
    CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;

/// Restores the stream and the context if the recording closure panics: a
/// stream left capturing fails every later call on it, and event tracking
/// left off would stop ordering cudarc's copies.
struct CaptureGuard<'a> {
    stream: &'a Arc<CudaStream>,
    tracking: bool,
    capturing: bool,
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if self.capturing {
            // As in `capture`: an error cudarc stored would stop
            // `end_capture` before `cuStreamEndCapture`; put back after.
            let ctx = self.stream.context();
            let stored = ctx.check_err();
            let _ = self.stream.end_capture(CAPTURE_FLAGS);
            ctx.record_err(stored);
        }
        if self.tracking {
            // SAFETY: restores the setting `capture` found, as its own
            // success path does; `capture`'s contract keeps other threads
            // off the context meanwhile.
            unsafe { self.stream.context().enable_event_tracking() };
        }
    }
}

/// A CUDA graph captured from one stream, replayed on it.
///
/// Capture with [`CapturedGraph::capture`]: `cuStreamBeginCapture` (thread
/// local mode), the caller's launches, `cuStreamEndCapture` and
/// `cuGraphInstantiate` (through cudarc's `CudaStream::begin_capture` /
/// `end_capture`); replay with `cuGraphLaunch` (`CudaGraph::launch`).
pub struct CapturedGraph {
    graph: CudaGraph,
}

impl fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapturedGraph")
    }
}

impl CapturedGraph {
    /// Records what `record` issues on `stream` into a graph instead of
    /// running it.
    ///
    /// The context is synchronised first, and cudarc's cross-stream event
    /// tracking is suspended while capturing (a captured stream may not wait
    /// for events recorded outside the capture); launches through
    /// [`Launcher`](super::Launcher) skip their event bookkeeping while the
    /// stream captures, and cudarc (from 0.19) records and waits for no
    /// buffer event of a copy while tracking is off.
    ///
    /// # Safety
    /// * No other thread may use the context while the capture runs (event
    ///   tracking is a context-wide switch).
    /// * `record` may only issue launches and device-to-device copies on
    ///   `stream`: no allocation (allocate every buffer before capturing),
    ///   no synchronous transfer, no other stream. A pool on the captured
    ///   stream refuses to allocate meanwhile and defers the frees of
    ///   blocks dropped meanwhile ([`CudaMemory`](super::CudaMemory)), but
    ///   a buffer dropped inside `record` must not be one a captured
    ///   launch uses: the pool may hand it out again before a replay. No
    ///   pool and no [`Launcher`](super::Launcher) may be dropped inside
    ///   `record` (the pool's last handle frees its blocks, which a capture
    ///   cannot take).
    pub unsafe fn capture(
        stream: &Arc<CudaStream>,
        record: impl FnOnce(&Arc<CudaStream>) -> GpuResult<()>,
    ) -> GpuResult<Self> {
        let ctx = stream.context().clone();
        ctx.synchronize()
            .map_err(driver_error("cuCtxSynchronize"))?;
        let tracking = ctx.is_event_tracking();
        if tracking {
            ctx.disable_event_tracking();
        }
        let mut guard = CaptureGuard {
            stream,
            tracking,
            capturing: false,
        };
        let begun = stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(driver_error("cuStreamBeginCapture"));
        guard.capturing = begun.is_ok();
        let recorded = begun.and_then(|()| record(stream));
        guard.capturing = false;
        // cudarc's `end_capture` first returns any error a destructor stored
        // meanwhile (`bind_to_thread` checks it) and then never calls
        // `cuStreamEndCapture`, which would leave the stream capturing and
        // every later call on it failing. Take that error out first, end
        // the capture, then report it.
        let deferred = ctx.check_err();
        let ended = stream
            .end_capture(CAPTURE_FLAGS)
            .map_err(driver_error("cuStreamEndCapture"));
        drop(guard);
        if let Err(e) = recorded {
            // Put back for the next call to report: this one reports the
            // closure's.
            ctx.record_err(deferred);
            return Err(e);
        }
        deferred.map_err(driver_error(
            "(deferred, recorded by cudarc during the capture)",
        ))?;
        match ended? {
            Some(graph) => Ok(CapturedGraph { graph }),
            None => Err(GpuError::invalid_config(
                "nothing was captured: the recording closure issued no work",
            )),
        }
    }

    /// Replays the graph on the stream it was captured from.
    ///
    /// The replay records no event on the buffers its launches use (cudarc's
    /// cross-stream ordering): read what it wrote on that stream (every
    /// [`Transfer`](super::Transfer) of the context's own stream does), or
    /// synchronise first, before another stream touches those buffers.
    ///
    /// # Safety
    /// Every buffer the captured launches use must still be alive, at the
    /// same address (not dropped and handed to someone else by the pool),
    /// and so must every [`Launcher`](super::Launcher) whose kernels were
    /// captured: dropping one unloads its module, and the graph's nodes
    /// would name a function that no longer exists.
    pub unsafe fn replay(&self) -> GpuResult<()> {
        self.graph.launch().map_err(driver_error("cuGraphLaunch"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chars(dispatches: u32, reduction: bool, min_work: u64) -> KernelCharacteristics {
        KernelCharacteristics {
            dispatches_per_call: dispatches,
            reduction_only: reduction,
            min_useful_work: min_work,
            hint: None,
        }
    }

    #[test]
    fn strategy_names() {
        assert_eq!(
            DispatchStrategy::parse("direct"),
            Some(DispatchStrategy::Direct)
        );
        assert_eq!(
            DispatchStrategy::parse(" GRAPH "),
            Some(DispatchStrategy::GraphCapture)
        );
        for alias in ["graph_capture", "graph-capture", "Capture"] {
            assert_eq!(
                DispatchStrategy::parse(alias),
                Some(DispatchStrategy::GraphCapture)
            );
        }
        assert_eq!(DispatchStrategy::parse("replay"), None);
        assert_eq!(DispatchStrategy::GraphCapture.to_string(), "graph");
        for name in DispatchStrategy::NAMES {
            assert_eq!(DispatchStrategy::parse(name).unwrap().name(), *name);
        }
        let e = "fast".parse::<DispatchStrategy>().unwrap_err();
        assert!(e.to_string().contains("known: direct, graph"), "{e}");
    }

    #[test]
    fn parse_valid_overrides() {
        let o = parse_override("adm:graph, motion:direct ,, vif : GRAPH,").unwrap();
        assert_eq!(o.len(), 3);
        assert_eq!(o.get("adm"), Some(DispatchStrategy::GraphCapture));
        assert_eq!(o.get("motion"), Some(DispatchStrategy::Direct));
        assert_eq!(o.get("vif"), Some(DispatchStrategy::GraphCapture));
        assert_eq!(o.get("psnr"), None);
        let order: Vec<_> = o.iter().map(|(f, _)| f).collect();
        assert_eq!(order, ["adm", "motion", "vif"]);
        assert!(parse_override("").unwrap().is_empty());
        assert!(parse_override("  , ,").unwrap().is_empty());
        // Repeating an entry with the same strategy is harmless.
        assert_eq!(parse_override("a:graph,a:graph").unwrap().len(), 1);
        // Names with dots, dashes and digits.
        assert!(parse_override("scan_f32.v4-k128:direct").is_ok());
    }

    #[test]
    fn wildcard_applies_to_families_without_their_own_entry() {
        let o = parse_override("*:graph,scan:direct").unwrap();
        assert_eq!(o.get("scan"), Some(DispatchStrategy::Direct));
        assert_eq!(o.get("anything"), Some(DispatchStrategy::GraphCapture));
    }

    #[test]
    fn parse_errors_name_the_bad_token() {
        let e = parse_override("adm:graph,motion").unwrap_err();
        assert_eq!(e.token, "motion");
        assert_eq!(e.kind, OverrideErrorKind::MissingSeparator);
        assert!(
            e.to_string()
                .starts_with("FRAGLINK_CUDA_DISPATCH: bad entry `motion`"),
            "{e}"
        );

        let e = parse_override("adm:grpah").unwrap_err();
        assert_eq!(e.token, "adm:grpah");
        match &e.kind {
            OverrideErrorKind::UnknownStrategy { given, known } => {
                assert_eq!(given, "grpah");
                assert_eq!(known, &["direct", "graph"]);
            }
            k => panic!("{k:?}"),
        }
        assert!(
            e.to_string()
                .contains("unknown strategy `grpah` (known: direct, graph)"),
            "{e}"
        );

        let e = parse_override(":graph").unwrap_err();
        assert_eq!(e.kind, OverrideErrorKind::EmptyFamily);
        let e = parse_override("a b:graph").unwrap_err();
        assert_eq!(e.kind, OverrideErrorKind::InvalidFamily("a b".into()));
        let e = parse_override("adm:").unwrap_err();
        assert!(
            matches!(e.kind, OverrideErrorKind::UnknownStrategy { ref given, .. } if given.is_empty())
        );
        let e = parse_override("adm:graph,x:direct,adm:direct").unwrap_err();
        assert_eq!(e.token, "adm:direct");
        assert_eq!(
            e.kind,
            OverrideErrorKind::Conflict {
                family: "adm".into(),
                first: DispatchStrategy::GraphCapture,
                second: DispatchStrategy::Direct
            }
        );
        assert!(
            e.to_string()
                .contains("`adm` is set to both graph and direct"),
            "{e}"
        );
        // `a:b:c`: the strategy is `b:c`, unknown.
        assert!(matches!(
            parse_override("a:b:c").unwrap_err().kind,
            OverrideErrorKind::UnknownStrategy { .. }
        ));
        // Into GpuError, keeping the text.
        let g: GpuError = parse_override("x").unwrap_err().into();
        assert!(g.to_string().contains("bad entry `x`"));
    }

    #[test]
    fn rules_in_order() {
        let p = DispatchPolicy::default();
        let big = 1 << 30;
        // 2: unregistered.
        let d = decide_with("nope", None, None, &p, big);
        assert_eq!(
            (d.strategy, d.source),
            (DispatchStrategy::Direct, DecisionSource::Unregistered)
        );
        assert!(d.reason.contains("`nope`"), "{}", d.reason);
        // 4: one dispatch per call.
        let d = decide_with("scan", Some(&chars(1, false, 0)), None, &p, big);
        assert_eq!(
            (d.strategy, d.source),
            (DispatchStrategy::Direct, DecisionSource::Rule)
        );
        assert!(d.reason.contains("1 launch(es) per call"), "{}", d.reason);
        // 5: reduction only, however many dispatches.
        let d = decide_with("psnr", Some(&chars(4, true, 0)), None, &p, big);
        assert_eq!(d.strategy, DispatchStrategy::Direct);
        assert!(d.reason.contains("reduction"), "{}", d.reason);
        // 6: below the family's threshold, then at it.
        let adm = chars(16, false, 921_600);
        let d = decide_with("adm", Some(&adm), None, &p, 921_599);
        assert_eq!(d.strategy, DispatchStrategy::Direct);
        assert!(
            d.reason.contains("below the graph threshold 921600"),
            "{}",
            d.reason
        );
        let d = decide_with("adm", Some(&adm), None, &p, 921_600);
        assert_eq!(
            (d.strategy, d.source),
            (DispatchStrategy::GraphCapture, DecisionSource::Rule)
        );
        assert!(
            d.reason.contains("saves 15 launch overheads"),
            "{}",
            d.reason
        );
        // 6: a zero threshold falls back to the policy's default, which is
        // none: graph replay from 2 launches on, however little the work
        // (measured on an H100, module docs).
        let vif = chars(4, false, 0);
        assert_eq!(p.default_min_useful_work, 0);
        assert_eq!(
            decide_with("vif", Some(&vif), None, &p, 1).strategy,
            DispatchStrategy::GraphCapture
        );
        let with_default = DispatchPolicy {
            default_min_useful_work: 1000,
            ..p
        };
        assert_eq!(
            decide_with("vif", Some(&vif), None, &with_default, 999).strategy,
            DispatchStrategy::Direct
        );
        assert_eq!(
            decide_with("vif", Some(&vif), None, &with_default, 1000).strategy,
            DispatchStrategy::GraphCapture
        );
        // Exactly min_graph_dispatches qualifies.
        assert_eq!(
            decide_with("motion", Some(&chars(2, false, 1)), None, &p, 1).strategy,
            DispatchStrategy::GraphCapture
        );
        // A stricter policy.
        let strict = DispatchPolicy {
            min_graph_dispatches: 8,
            ..p
        };
        assert_eq!(
            decide_with("vif", Some(&vif), None, &strict, big).strategy,
            DispatchStrategy::Direct
        );
    }

    #[test]
    fn hint_beats_rules_and_override_beats_everything() {
        let p = DispatchPolicy::default();
        let hinted = KernelCharacteristics {
            hint: Some(DispatchStrategy::GraphCapture),
            ..chars(1, true, u64::MAX)
        };
        let d = decide_with("k", Some(&hinted), None, &p, 0);
        assert_eq!(
            (d.strategy, d.source),
            (DispatchStrategy::GraphCapture, DecisionSource::Hint)
        );
        let d = decide_with("k", Some(&hinted), Some(DispatchStrategy::Direct), &p, 0);
        assert_eq!(
            (d.strategy, d.source),
            (DispatchStrategy::Direct, DecisionSource::Override)
        );
        assert!(
            d.reason
                .contains("FRAGLINK_CUDA_DISPATCH sets `k` to direct"),
            "{}",
            d.reason
        );
        // An override also applies to unregistered families.
        let d = decide_with("x", None, Some(DispatchStrategy::GraphCapture), &p, 0);
        assert_eq!(d.strategy, DispatchStrategy::GraphCapture);
    }

    #[test]
    fn registry_register_decide_and_override() {
        let r = DispatchRegistry::with_builtin();
        assert_eq!(r.characteristics("scan").unwrap().dispatches_per_call, 1);
        assert_eq!(r.decide("scan", 1 << 40).strategy, DispatchStrategy::Direct);
        r.register("adm", chars(16, false, 1000));
        assert_eq!(r.decide("adm", 999).strategy, DispatchStrategy::Direct);
        assert_eq!(
            r.decide("adm", 1000).strategy,
            DispatchStrategy::GraphCapture
        );
        // Re-registering replaces.
        r.register("adm", chars(16, true, 1000));
        assert_eq!(r.decide("adm", 1000).strategy, DispatchStrategy::Direct);

        let r = DispatchRegistry::with_builtin()
            .with_overrides(parse_override("scan:graph,*:direct").unwrap());
        r.register("adm", chars(16, false, 1));
        let d = r.decide("scan", 0);
        assert_eq!(
            (d.strategy, d.source),
            (DispatchStrategy::GraphCapture, DecisionSource::Override)
        );
        assert_eq!(r.decide("adm", 1 << 30).strategy, DispatchStrategy::Direct);
        assert_eq!(r.overrides().len(), 2);

        let mut o = DispatchOverrides::default();
        o.set("a", DispatchStrategy::Direct);
        o.set("a", DispatchStrategy::GraphCapture);
        assert_eq!(o.len(), 1);
        assert_eq!(o.get("a"), Some(DispatchStrategy::GraphCapture));
    }

    #[test]
    fn registry_is_shared_across_threads() {
        let r = Arc::new(DispatchRegistry::new(DispatchPolicy::default()));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let name = format!("k{i}");
                    r.register(&name, chars(4, false, 10));
                    r.decide(&name, 10).strategy
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), DispatchStrategy::GraphCapture);
        }
        assert_eq!(r.decide("k9", 10).source, DecisionSource::Unregistered);
    }
}

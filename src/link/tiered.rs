//! Tiered links: a configuration's first call runs a quick link, the
//! optimised one replaces it in the background.
//!
//! A cold LTO link of one search kernel takes 60–150 ms (nvJitLink 13.0,
//! sm_90): NVVM re-optimises the whole program, then ptxas compiles it.
//! Every fragment built for a real arch (`sm_90` in the default arch list)
//! also carries the relocatable SASS that ptxas made of it at build time
//! ([`FragmentInfo::sass`]); linking those without LTO only resolves symbols
//! and lays out the cubin: about a millisecond. The kernel it gives calls
//! the metric and filter through the ABI instead of inlining them (more
//! registers, a small stack frame, slower), and computes the same bits:
//! fragments round through explicit intrinsics (`fragments/common.cuh`), so
//! no contraction can differ between inlined and called code.
//!
//! [`LinkRuntime::link_tiered`] therefore answers a plan that is neither in
//! memory nor on disk with the quick link, kept in memory only, and starts
//! the full link on a thread of its own; that one goes to memory and disk
//! as any link does, and from then on the same call returns it. A caller that
//! asks again per launch (the search paths, through their launcher maps
//! keyed by [`LinkKey`]) moves to the optimised kernel by itself. A caller
//! that keeps what it got forever should call [`LinkRuntime::link`].
//!
//! The process's exit waits for optimised links still running (at most 30
//! s): exiting under a running nvJitLink aborted or crashed the process.
//! For that wait to run before nvJitLink's own exit handlers, the first
//! quick link of a process also runs one small LTO link (10–15 ms).
//!
//! `FRAGLINK_QUICK_LINK=0` turns the quick tier off: every cold call waits
//! for the full link.
//!
//! [`FragmentInfo::sass`]: crate::fragment::FragmentInfo::sass

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::build::arch::Arch;

use super::cache::Source;
use super::key::LinkKey;
use super::linker::{LinkInput, LinkOptions};
use super::planner::Planner;
use super::runtime::{checked_metadata, LinkRuntime, Linked, LinkedKernel, Prepared};
use super::LinkError;

/// Environment variable: `0` turns quick first links off (on by default).
pub const ENV_QUICK_LINK: &str = "FRAGLINK_QUICK_LINK";

/// Marks a quick link's key: the same fragments and arch without `-lto`
/// are a different cubin, and this can never be an nvJitLink option.
const QUICK_KEY_MARK: &str = "fraglink:quick-sass";

/// The static shared memory one block may declare (48 KiB on every arch).
/// A quick link's cubin counts the driver's 1 KiB reservation per block in
/// it (`.nv.reservedSmem`, laid out at offset 0), which a whole-program LTO
/// cubin leaves to the driver: 1 KiB more than the optimised kernel's
/// figure, so a kernel that declares nearly 48 KiB (IVF's capacity 2048)
/// gets no quick link.
pub const STATIC_SHARED_LIMIT: u32 = 48 * 1024;

/// Whether `FRAGLINK_QUICK_LINK` allows quick links (unset: yes).
pub fn quick_link_from_env() -> Result<bool, LinkError> {
    crate::switch::switch_by_env(ENV_QUICK_LINK, true).map_err(|value| LinkError::InvalidEnv {
        var: ENV_QUICK_LINK,
        value,
        reason: format!("expected {}", crate::switch::SWITCH_EXPECTED),
    })
}

/// How long a failed optimised link keeps its quick link serving before a
/// call tries it again (a transient failure, such as memory, heals).
pub const UPGRADE_RETRY: Duration = Duration::from_secs(60);

/// How long the process's exit waits for optimised links still running
/// ([`wait_at_exit`]).
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Where the optimised link of a key stands.
#[derive(Debug, Clone)]
enum Upgrade {
    Running,
    /// It failed at this time: the quick link serves on until
    /// [`UPGRADE_RETRY`] has passed.
    Failed(Arc<LinkError>, Instant),
}

/// The optimised links started in the background, by final key.
#[derive(Default)]
pub(super) struct Upgrades {
    state: Mutex<HashMap<LinkKey, Upgrade>>,
    settled: Condvar,
}

impl Upgrades {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<LinkKey, Upgrade>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `true` when this call claimed the key: no upgrade of it runs, and
    /// none failed less than [`UPGRADE_RETRY`] ago.
    fn claim(&self, key: LinkKey) -> bool {
        let mut st = self.lock();
        match st.get(&key) {
            Some(Upgrade::Running) => return false,
            Some(Upgrade::Failed(_, at)) if at.elapsed() < UPGRADE_RETRY => return false,
            _ => {}
        }
        st.insert(key, Upgrade::Running);
        true
    }

    /// The upgrade of `key` ended: `None` when it never ran (no thread).
    fn settle(&self, key: LinkKey, result: Option<Result<(), LinkError>>) {
        let mut st = self.lock();
        match result {
            Some(Err(e)) => {
                st.insert(key, Upgrade::Failed(Arc::new(e), Instant::now()));
            }
            _ => {
                st.remove(&key);
            }
        }
        self.settled.notify_all();
    }

    /// The error of a recent failed upgrade of `key`.
    fn failed(&self, key: &LinkKey) -> Option<Arc<LinkError>> {
        match self.lock().get(key) {
            Some(Upgrade::Failed(e, at)) if at.elapsed() < UPGRADE_RETRY => Some(e.clone()),
            _ => None,
        }
    }
}

/// Optimised links running in the background, over every runtime of the
/// process: what its exit waits for.
static IN_FLIGHT: Mutex<usize> = Mutex::new(0);
static IN_FLIGHT_DONE: Condvar = Condvar::new();

fn in_flight() -> std::sync::MutexGuard<'static, usize> {
    IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registered with `atexit` before the first background link: the
/// process's exit waits (at most [`EXIT_WAIT`]) for the optimised links
/// still running. Otherwise a short process (a CLI run, a test) would exit
/// while nvJitLink links on another thread: nvJitLink's exit handlers ran
/// under it (it aborted or crashed in 14 of 20 such exits on a loaded
/// 2-core VM), and the next process found no optimised kernel on disk.
/// Exit handlers run newest first, and nvJitLink registers some of its own
/// during its first LTO link: [`register_exit_wait`] therefore runs one
/// small LTO link before registering this one.
extern "C" fn wait_at_exit() {
    let started = Instant::now();
    let mut n = in_flight();
    while *n > 0 {
        let Some(left) = EXIT_WAIT.checked_sub(started.elapsed()) else {
            return;
        };
        n = match IN_FLIGHT_DONE.wait_timeout(n, left) {
            Ok((n, _)) => n,
            Err(p) => p.into_inner().0,
        };
    }
}

/// Once per process: an LTO link of `plan`'s smallest fragment alone (so
/// that nvJitLink has registered the exit handlers its LTO path registers
/// at first use), then [`wait_at_exit`] with `atexit`, to run before them.
fn register_exit_wait(rt: &LinkRuntime, plan: &Planner, arch: Arch) {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        if let Some(f) = plan
            .static_fragments()
            .iter()
            .min_by_key(|f| f.fatbin.len())
        {
            let mut options = LinkOptions::new(arch);
            options.lto = Some(true);
            // Its result does not matter, only that the LTO path ran.
            let _ = rt.linker().link(&[LinkInput::fragment(f)], &options);
        }
        // SAFETY: `wait_at_exit` is an `extern "C"` function without
        // arguments that does not unwind (no call in it panics: poisoned
        // locks are taken over).
        unsafe { libc::atexit(wait_at_exit) };
    });
}

/// Whether a quick link's kernels can launch as their optimised link's can:
/// static shared memory within [`STATIC_SHARED_LIMIT`].
fn fits(quick: &Linked) -> bool {
    quick
        .kernel
        .kernels
        .iter()
        .all(|k| k.shared_bytes.unwrap_or(0) <= STATIC_SHARED_LIMIT)
}

/// The nvJitLink options of a quick link: no LTO, so nvJitLink takes each
/// fatbin's SASS for `arch` and only links it.
fn quick_options(arch: Arch) -> LinkOptions {
    let mut o = LinkOptions::new(arch);
    o.lto = Some(false);
    o
}

/// Whether `plan` can link quickly for `arch` with `options` (its full
/// link's): every fragment built in with SASS for exactly `arch`, and no
/// setting that changes the code's registers, precision or debug lines (the
/// SASS was compiled without them).
fn quick_serves(plan: &Planner, options: &LinkOptions, arch: Arch) -> bool {
    plan.sources().is_empty()
        && plan.static_fragments().iter().all(|f| f.has_sass_for(arch))
        && options.max_registers.is_none()
        && !options.lineinfo
        && [
            options.ftz,
            options.prec_div,
            options.prec_sqrt,
            options.fma,
        ]
        .iter()
        .all(Option::is_none)
}

impl LinkRuntime {
    /// Whether this runtime takes quick first links: [`set_quick_link`]
    /// where it was called, else `FRAGLINK_QUICK_LINK` for the process-wide
    /// runtime, else yes.
    ///
    /// [`set_quick_link`]: Self::set_quick_link
    fn quick_link_on(&self) -> Result<bool, LinkError> {
        self.quick_link
            .get_or_try_init(|| match self.is_global() {
                true => quick_link_from_env(),
                false => Ok(true),
            })
            .copied()
    }

    /// Turns quick first links on or off for this runtime; `false` when
    /// the setting was fixed already (by an earlier call or a first link).
    pub fn set_quick_link(&self, on: bool) -> bool {
        self.quick_link.set(on).is_ok()
    }

    /// Links `plan` for `arch` for a launch now: the optimised kernel when
    /// it is in memory or on disk, or when no quick link serves the plan
    /// (then as [`link`](Self::link)); otherwise a quick link (no LTO, about
    /// a millisecond; [`LinkedKernel::quick`] set), while the optimised link
    /// runs on a thread of its own. Ask again per launch: once that link is
    /// done, this returns it. See the [module docs](self).
    pub fn link_tiered(&'static self, plan: &Planner, arch: Arch) -> Result<Linked, LinkError> {
        let mut all = self.link_all_tiered(&[plan], arch)?;
        Ok(all.remove(0))
    }

    /// [`link_tiered`](Self::link_tiered) of several plans: quick links
    /// where they serve, the rest at the same time ([`link_all`](Self::link_all)).
    pub fn link_all_tiered(
        &'static self,
        plans: &[&Planner],
        arch: Arch,
    ) -> Result<Vec<Linked>, LinkError> {
        let mut done: Vec<Option<Linked>> = Vec::with_capacity(plans.len());
        for plan in plans {
            done.push(self.try_quick(plan, arch)?);
        }
        let rest: Vec<&Planner> = plans
            .iter()
            .zip(&done)
            .filter(|(_, d)| d.is_none())
            .map(|(p, _)| *p)
            .collect();
        let mut linked = self.link_all(&rest, arch)?.into_iter();
        Ok(done
            .into_iter()
            .map(|d| d.unwrap_or_else(|| linked.next().expect("one link per plan left")))
            .collect())
    }

    /// The plan's kernel without a full link, if it can be had so: from
    /// memory, or quickly linked (starting the optimised link). `None`: the
    /// full path must run (a disk hit, no quick link, quick links off).
    fn try_quick(&'static self, plan: &Planner, arch: Arch) -> Result<Option<Linked>, LinkError> {
        let request = match self.prepare(plan, arch)? {
            Prepared::Remembered(linked) => return Ok(Some(linked)),
            Prepared::Keyed(request) => request,
        };
        if let Some(kernel) = self.memory_peek(&request.key) {
            return Ok(Some(Linked {
                kernel,
                source: Source::Memory,
                key: request.key,
                elapsed: request.requested.elapsed(),
            }));
        }
        let arch = request.arch;
        if !quick_serves(plan, &request.options, arch) || !self.quick_link_on()? {
            return Ok(None);
        }
        let failed = self.upgrades().failed(&request.key);
        if failed.is_none() && self.disk().is_some_and(|d| d.holds(&request.key.hex())) {
            return Ok(None);
        }
        let quick = match self.quick_link(plan, arch, request.requested) {
            Ok(q) if fits(&q) => q,
            // No quick kernel to launch: the full link says what is wrong,
            // or works where this did not; where it failed already, its
            // error.
            _ => {
                return match failed {
                    None => Ok(None),
                    Some(e) => Err(LinkError::Shared(e)),
                }
            }
        };
        if failed.is_none() {
            self.upgrade_in_background(plan, arch, request.key);
        }
        // The plan was asked for: a profile lists it even if this process
        // ends before its optimised link does.
        self.record_profile(request.key, plan, arch);
        Ok(Some(quick))
    }

    /// Whether [`link_tiered`](Self::link_tiered) would answer `plan` for
    /// `arch` with a quick link when the optimised one is not at hand:
    /// quick links on, and every fragment built in with SASS for `arch`
    /// and no setting that changes the code. (A kernel whose quick link
    /// turns out too large for static shared memory still links in full.)
    pub fn links_quickly(&self, plan: &Planner, arch: Arch) -> bool {
        let arch = arch.real();
        self.quick_link_on().unwrap_or(false) && quick_serves(plan, &plan.options(arch), arch)
    }

    /// The quick link (no LTO) of `plan` for `arch` alone, in memory only,
    /// without starting the optimised one; `None` where no quick link
    /// serves the plan (a fragment without SASS for `arch`, a run-time
    /// source, a setting that changes the code). Whatever
    /// `FRAGLINK_QUICK_LINK` says: for comparing the two tiers.
    pub fn link_quick(&self, plan: &Planner, arch: Arch) -> Result<Option<Linked>, LinkError> {
        let arch = arch.real();
        if plan.is_empty() {
            return Err(LinkError::EmptyPlan {
                entry: plan.entry().to_string(),
            });
        }
        if !quick_serves(plan, &plan.options(arch), arch) {
            return Ok(None);
        }
        let quick = self.quick_link(plan, arch, Instant::now())?;
        Ok(fits(&quick).then_some(quick))
    }

    /// The non-LTO link of `plan`'s fragments' SASS, in memory only.
    fn quick_link(
        &self,
        plan: &Planner,
        arch: Arch,
        requested: Instant,
    ) -> Result<Linked, LinkError> {
        let options = quick_options(arch);
        let mut args = options.to_args();
        args.push(QUICK_KEY_MARK.to_string());
        let pairs: Vec<(&str, &str)> = plan
            .static_fragments()
            .iter()
            .map(|f| (f.name, f.hash))
            .collect();
        let entries: Vec<&str> = plan.entries().iter().map(String::as_str).collect();
        let key = LinkKey::new(&entries, &pairs, &args, self.linker().version());
        let produce = || -> Result<(LinkedKernel, Source), LinkError> {
            super::check::check_plan(plan, arch)?;
            let inputs: Vec<LinkInput<'_>> = plan
                .static_fragments()
                .iter()
                .map(|f| LinkInput::fragment(f))
                .collect();
            let started = Instant::now();
            let out = self.linker().link(&inputs, &options)?;
            let link_ms = started.elapsed().as_secs_f64() * 1e3;
            // nvJitLink's non-LTO log has no ptxas lines: the resources
            // come from the cubin's own records.
            let kernels = checked_metadata(&entries, arch, &out.cubin, &out.info_log, link_ms)?;
            let kernel = LinkedKernel {
                key: Some(key),
                entry: plan.entry().to_string(),
                arch: arch.to_string(),
                fragments: plan.fragment_names(),
                metadata: kernels[0].clone(),
                kernels,
                info_log: out.info_log,
                quick: true,
                cubin: out.cubin,
            };
            Ok((kernel, Source::Linked))
        };
        let (kernel, source) = self.memory_get_or_link(&key, produce)?;
        Ok(Linked {
            kernel,
            source,
            key,
            elapsed: requested.elapsed(),
        })
    }

    /// Starts the full link of `plan` under `key` on a thread of its own,
    /// once per key at a time; a failure (a panic included) is kept for
    /// [`UPGRADE_RETRY`], the quick link serving meanwhile, and said on
    /// stderr.
    fn upgrade_in_background(&'static self, plan: &Planner, arch: Arch, key: LinkKey) {
        if !self.upgrades().claim(key) {
            return;
        }
        register_exit_wait(self, plan, arch);
        *in_flight() += 1;
        let plan = plan.clone();
        let spawned = std::thread::Builder::new()
            .name("fraglink-upgrade".into())
            .spawn(move || {
                let linked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.link(&plan, arch).map(|_| ())
                }));
                let result = linked.unwrap_or_else(|panic| {
                    let reason = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_string());
                    Err(LinkError::Background {
                        entry: plan.entry().to_string(),
                        arch: arch.to_string(),
                        reason,
                    })
                });
                if let Err(e) = &result {
                    eprintln!(
                        "fraglink: warning: the optimised link of `{}` for {arch} failed; \
                         its quick link (no LTO) serves on, and the link is tried again \
                         after {} s: {e}",
                        plan.entry(),
                        UPGRADE_RETRY.as_secs()
                    );
                }
                self.upgrades().settle(key, Some(result));
                *in_flight() -= 1;
                IN_FLIGHT_DONE.notify_all();
            });
        if spawned.is_err() {
            // No thread: the next call claims the key again.
            self.upgrades().settle(key, None);
            *in_flight() -= 1;
            IN_FLIGHT_DONE.notify_all();
        }
    }

    /// Waits until no optimised link started by [`link_tiered`](Self::link_tiered)
    /// runs any more; returns how many plans' latest optimised link failed,
    /// however long ago: a failure stays recorded until a retry of that
    /// plan succeeds, also once [`UPGRADE_RETRY`] has passed and
    /// [`upgrade_error`](Self::upgrade_error) no longer reports it.
    pub fn wait_for_upgrades(&self) -> usize {
        let ups = self.upgrades();
        let mut st = ups.lock();
        while st.values().any(|u| matches!(u, Upgrade::Running)) {
            st = ups.settled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.values()
            .filter(|u| matches!(u, Upgrade::Failed(..)))
            .count()
    }

    /// The error of `plan`'s optimised link for `arch`, if it ran in the
    /// background and failed (its quick link then serves on).
    pub fn upgrade_error(&self, plan: &Planner, arch: Arch) -> Option<Arc<LinkError>> {
        let key = match self.prepare(plan, arch).ok()? {
            Prepared::Remembered(l) => l.key,
            Prepared::Keyed(r) => r.key,
        };
        self.upgrades().failed(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_links_take_no_lto_and_their_key_differs_from_every_full_link() {
        let args = quick_options(Arch::sm(90)).to_args();
        assert_eq!(args, ["-arch=sm_90", "-O3", "-verbose"]);
        assert!(!QUICK_KEY_MARK.starts_with('-'));
    }

    #[test]
    fn settings_that_change_the_code_leave_the_quick_tier() {
        let plan = Planner::new("scan_f32_u32_v4_k32")
            .add_named("scan_f32_u32_v4_k32")
            .unwrap();
        let arch = Arch::sm(90);
        let mut o = plan.options(arch);
        let has_sass = plan.static_fragments()[0].has_sass_for(arch);
        assert_eq!(quick_serves(&plan, &o, arch), has_sass);
        o.max_registers = Some(64);
        assert!(!quick_serves(&plan, &o, arch));
        let mut o = plan.options(arch);
        o.lineinfo = true;
        assert!(!quick_serves(&plan, &o, arch));
        let mut o = plan.options(arch);
        o.ftz = Some(true);
        assert!(!quick_serves(&plan, &o, arch));
        // No SASS for sm_80 in the default arch list (compute_80 is LTO-IR).
        assert!(!quick_serves(
            &plan,
            &plan.options(Arch::sm(80)),
            Arch::sm(80)
        ));
    }
}

//! Prelinking: link many plans ahead of time, in parallel, into the memory
//! and disk caches, so that a later first call of each is a cache hit.
//!
//! cuVS links each new configuration on its first call (235–500 ms on an
//! H100, cuVS PR #2099) and has no way to do it earlier; its users ask for
//! a warm-up (rapidsai/cuvs#1523, #1534). Here a process (or `fraglink
//! prelink`) links the plans of a profile ([`super::profile`]) or of whole
//! families ([`PlanFamily`]) into the disk cache, and a later process finds
//! them there.
//!
//! ```no_run
//! use fraglink::build::Arch;
//! use fraglink::link::prelink;
//! let plans = fraglink::families::find("scan").unwrap().plans();
//! let report = prelink::prelink(&plans, Arch::sm(90), 0)?;
//! println!("{} linked, {} from disk, {} failed", report.linked, report.from_disk, report.failed.len());
//! # Ok::<(), fraglink::link::LinkError>(())
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::build::arch::Arch;

use super::cache::Source;
use super::planner::Planner;
use super::runtime::LinkRuntime;
use super::LinkError;

/// A family of plans that can be enumerated: every valid plan its planner
/// rules can produce. Declared next to those rules, and listed in
/// [`crate::families::PLAN_FAMILIES`], so `fraglink prelink --family` and
/// `--all` know it.
#[derive(Clone, Copy)]
pub struct PlanFamily {
    pub name: &'static str,
    /// One line for `fraglink prelink --help`-style listings.
    pub about: &'static str,
    enumerate: fn() -> Vec<Planner>,
}

impl PlanFamily {
    pub const fn new(
        name: &'static str,
        about: &'static str,
        enumerate: fn() -> Vec<Planner>,
    ) -> Self {
        PlanFamily {
            name,
            about,
            enumerate,
        }
    }

    /// Every valid plan of the family.
    pub fn plans(&self) -> Vec<Planner> {
        (self.enumerate)()
    }

    /// Checks the enumerator against the family's planner rules: `reached`
    /// are the plans those rules produce over a sweep of inputs. Every
    /// reached plan must be enumerated, every enumerated plan reached, and
    /// none enumerated twice (plans compare by entries and fragments). Each
    /// family's tests call this, so an enumerator cannot drift from its
    /// rules.
    pub fn check_against(&self, reached: impl IntoIterator<Item = Planner>) -> Result<(), String> {
        let id = |p: &Planner| {
            format!(
                "{} [{}]",
                p.entries().join(" "),
                p.fragment_names().join(" ")
            )
        };
        let plans = self.plans();
        let enumerated: std::collections::HashSet<String> = plans.iter().map(id).collect();
        if enumerated.len() != plans.len() {
            return Err(format!("`{}` enumerates a plan twice", self.name));
        }
        let mut unreached = enumerated.clone();
        for p in reached {
            let id = id(&p);
            if !enumerated.contains(&id) {
                return Err(format!("`{}` does not enumerate {id}", self.name));
            }
            unreached.remove(&id);
        }
        match unreached.iter().next() {
            None => Ok(()),
            Some(id) => Err(format!(
                "`{}` enumerates {id} (and {} more) that its rules never plan",
                self.name,
                unreached.len() - 1
            )),
        }
    }
}

impl std::fmt::Debug for PlanFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanFamily")
            .field("name", &self.name)
            .finish()
    }
}

/// One plan that did not link.
#[derive(Debug)]
pub struct PrelinkFailure {
    pub entry: String,
    pub fragments: Vec<String>,
    pub arch: Arch,
    pub error: LinkError,
}

/// What a prelink did.
#[derive(Debug, Default)]
pub struct PrelinkReport {
    /// Linked by nvJitLink now (and stored in the disk cache, if any).
    pub linked: usize,
    /// Already in the disk cache.
    pub from_disk: usize,
    /// Already in this runtime's memory (a repeated plan, or linked before).
    pub from_memory: usize,
    pub failed: Vec<PrelinkFailure>,
    pub elapsed: Duration,
    /// Whether the runtime has an enabled disk cache (`FRAGLINK_CACHE_DISABLE`
    /// or an unusable directory disable it): without one, prelinked kernels
    /// live only as long as this process.
    pub disk_cache: bool,
}

impl PrelinkReport {
    pub fn total(&self) -> usize {
        self.linked + self.from_disk + self.from_memory + self.failed.len()
    }
}

/// Progress of a prelink, passed to the callback after each plan.
#[derive(Debug)]
pub struct Progress<'a> {
    /// Plans finished so far (this one included).
    pub done: usize,
    pub total: usize,
    pub entry: &'a str,
    pub arch: Arch,
    /// Where this plan's kernel came from, or why it failed.
    pub outcome: Result<Source, &'a LinkError>,
}

/// Links every plan for `arch` through the process-wide runtime, with
/// `parallelism` threads (0: one per core; at most two per core and one
/// per plan, whatever is asked). Failures are collected, not
/// returned: one bad plan does not stop the others.
pub fn prelink(
    plans: &[Planner],
    arch: Arch,
    parallelism: usize,
) -> Result<PrelinkReport, LinkError> {
    let jobs: Vec<(&Planner, Arch)> = plans.iter().map(|p| (p, arch)).collect();
    Ok(prelink_with(
        LinkRuntime::global()?,
        &jobs,
        parallelism,
        &|_| {},
    ))
}

/// Links each `(plan, arch)` through `runtime` with `parallelism` threads
/// (0: one per core; at most two per core and one per job: each link can
/// take hundreds of MB, and more threads than that only add memory), the
/// calling thread among them, calling `progress` after each. A thread the
/// system refuses to start leaves its share to those that did start.
pub fn prelink_with(
    runtime: &LinkRuntime,
    jobs: &[(&Planner, Arch)],
    parallelism: usize,
    progress: &(dyn Fn(&Progress<'_>) + Sync),
) -> PrelinkReport {
    let started = Instant::now();
    let done = AtomicUsize::new(0);
    let report = Mutex::new(PrelinkReport {
        disk_cache: runtime.disk().is_some_and(|d| d.is_enabled()),
        ..PrelinkReport::default()
    });
    let threads = crate::workers::thread_count(parallelism, jobs.len());
    crate::workers::map_bounded(jobs.to_vec(), threads, &|(plan, arch)| {
        let result = runtime.link(plan, arch).map(|l| l.source);
        let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
        progress(&Progress {
            done: finished,
            total: jobs.len(),
            entry: plan.entry(),
            arch,
            outcome: result.as_ref().copied(),
        });
        let mut r = report.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(Source::Linked) => r.linked += 1,
            Ok(Source::Disk) => r.from_disk += 1,
            Ok(Source::Memory) => r.from_memory += 1,
            Err(error) => r.failed.push(PrelinkFailure {
                entry: plan.entry().to_string(),
                fragments: plan.fragment_names(),
                arch,
                error,
            }),
        }
    });
    let mut report = report.into_inner().unwrap_or_else(|p| p.into_inner());
    report.elapsed = started.elapsed();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::RuntimeConfig;

    fn runtime(disk: Option<&std::path::Path>) -> LinkRuntime {
        LinkRuntime::new(RuntimeConfig {
            memory_capacity: 16,
            disk: disk.map(crate::link::disk::DiskCacheConfig::new),
        })
        .expect("nvJitLink loads from the path baked at build time")
    }

    fn plan(scan: &str) -> Planner {
        Planner::new(scan)
            .add_named(scan)
            .unwrap()
            .add_named("metric_l2_f32")
            .unwrap()
            .add_named("filter_none_u32")
            .unwrap()
    }

    #[test]
    fn check_against_finds_drift_both_ways() {
        fn two() -> Vec<Planner> {
            vec![plan("scan_f32_u32_v4_k32"), plan("scan_f32_u32_v1_k128")]
        }
        fn twice() -> Vec<Planner> {
            vec![plan("scan_f32_u32_v4_k32"), plan("scan_f32_u32_v4_k32")]
        }
        let fam = PlanFamily::new("t", "test", two);
        assert!(fam.check_against(two()).is_ok());
        let e = fam
            .check_against([plan("scan_f32_u32_v4_k32")])
            .unwrap_err();
        assert!(e.contains("never plan"), "{e}");
        let e = fam
            .check_against(two().into_iter().chain([plan("scan_f32_u32_v4_k128")]))
            .unwrap_err();
        assert!(
            e.contains("does not enumerate") && e.contains("v4_k128"),
            "{e}"
        );
        let e = PlanFamily::new("t", "test", twice)
            .check_against(twice())
            .unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    /// Needs nvJitLink (found as for every link test), no GPU.
    #[test]
    fn links_in_parallel_counts_sources_and_keeps_going() {
        let dir = tempfile::tempdir().unwrap();
        let a = plan("scan_f32_u32_v4_k32");
        let b = plan("scan_f32_u32_v1_k128");
        let broken = Planner::new("no_such_entry")
            .add_named("metric_l2_f32")
            .unwrap();
        let jobs = [
            (&a, Arch::sm(80)),
            (&b, Arch::sm(80)),
            (&broken, Arch::sm(80)),
            (&a, Arch::sm(90)),
        ];
        let seen = AtomicUsize::new(0);
        let rt = runtime(Some(dir.path()));
        let r = prelink_with(&rt, &jobs, 3, &|p| {
            assert_eq!(p.total, 4);
            seen.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(seen.load(Ordering::Relaxed), 4);
        assert_eq!((r.linked, r.from_disk, r.from_memory), (3, 0, 0), "{r:?}");
        assert_eq!(r.failed.len(), 1);
        assert_eq!(r.failed[0].entry, "no_such_entry");
        assert!(r.disk_cache);
        // A fresh runtime (a later process) finds all three on disk.
        let later = runtime(Some(dir.path()));
        let r = prelink_with(&later, &jobs[..2], 0, &|_| {});
        assert_eq!((r.linked, r.from_disk, r.failed.len()), (0, 2, 0), "{r:?}");
        // And the same runtime again serves them from memory.
        let r = prelink_with(&later, &jobs[..2], 1, &|_| {});
        assert_eq!(r.from_memory, 2, "{r:?}");
    }

    /// `--jobs 100000` once started one thread per plan (1285 nvJitLink
    /// links at once for `--all`, out of memory); the threads are now at
    /// most two per core whatever is asked. Empty plans fail at once, and
    /// the progress callback holds each thread long enough that every
    /// thread started takes a job.
    #[test]
    fn asking_for_many_jobs_starts_at_most_two_threads_per_core() {
        let cap = crate::workers::max_threads();
        let plans: Vec<Planner> = (0..cap * 2 + 8)
            .map(|i| Planner::new(format!("empty_{i}")))
            .collect();
        let jobs: Vec<(&Planner, Arch)> = plans.iter().map(|p| (p, Arch::sm(90))).collect();
        let threads = Mutex::new(std::collections::HashSet::new());
        let rt = runtime(None);
        let r = prelink_with(&rt, &jobs, 100_000, &|_| {
            threads.lock().unwrap().insert(std::thread::current().id());
            std::thread::sleep(Duration::from_millis(20));
        });
        assert_eq!(r.failed.len(), jobs.len(), "{r:?}");
        let used = threads.into_inner().unwrap().len();
        assert!(used <= cap, "{used} threads for a cap of {cap}");
    }

    /// The remembered key never outlives the plan content it was computed
    /// for: a changed clone, another arch and another runtime each get
    /// their own key.
    #[test]
    fn remembered_keys_follow_plan_arch_and_runtime() {
        let rt = runtime(None);
        let a = plan("scan_f32_u32_v4_k32");
        let first = rt.link(&a, Arch::sm(80)).unwrap();
        let hit = rt.link(&a, Arch::sm(80)).unwrap();
        assert_eq!((hit.source, hit.key), (Source::Memory, first.key));
        let changed = a.clone().max_registers(32);
        let other = rt.link(&changed, Arch::sm(80)).unwrap();
        assert_eq!(other.source, Source::Linked);
        assert_ne!(other.key, first.key);
        assert_eq!(rt.link(&a, Arch::sm(80)).unwrap().key, first.key);
        assert_ne!(rt.link(&a, Arch::sm(90)).unwrap().key, first.key);
        // Another runtime with the same nvJitLink computes the same key
        // itself (it is not served from the first runtime's memory).
        let rt2 = runtime(None);
        let l = rt2.link(&a, Arch::sm(80)).unwrap();
        assert_eq!((l.source, l.key), (Source::Linked, first.key));
        assert_eq!(rt.stats().hits, 2);
    }
}

//! `FRAGLINK_SEARCH_TRACE=1`: where one routed search's wall time goes.
//!
//! At one query the first H200 run (GPU.md at 6f7ea6a) measured a search's
//! wall time well above its kernels' (Nsight Compute, real clocks): the
//! tensor-core path 586 µs against 453 µs of kernels, the scan 584 µs against
//! 352 µs. No host profiler runs on the GPU machines (no nsys, perf or
//! strace), so the search marks its own steps: host time between marks, and
//! CUDA events recorded on the stream after each step that queues device work,
//! so the device time of that step (and the idle gap before it) shows beside
//! the host time that issued it. `wall − gpu span` is what the host adds on
//! the critical path.
//!
//! Off (the default) every mark is one thread-local read. On, each device
//! mark records an event (about a microsecond): trace a separate run, not the
//! one whose QPS is reported. The trace covers [`Searcher`]'s timed window
//! (`Routed::seconds`) on the thread that runs it; steps of several batches
//! add up under one name (with their count).
//!
//! [`Searcher`]: crate::search::route::Searcher

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use serde::Serialize;

/// The variable that turns tracing on (`1`/`true`/`yes`/`on`).
pub const TRACE_VAR: &str = "FRAGLINK_SEARCH_TRACE";

/// One step of a traced search, its batches added up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStep {
    /// What the step did (fixed names, e.g. `upload queries`).
    pub step: &'static str,
    /// How many times it ran (once per batch, or per launch).
    pub count: u32,
    /// Host time from the mark before to this step's mark, µs.
    pub host_us: f64,
    /// Device time from the event before to this step's event, µs: the
    /// work the step queued, and any time the device sat idle waiting for
    /// it. `None` for steps that queue no device work.
    pub gpu_us: Option<f64>,
}

/// Where a search's time went ([`TRACE_VAR`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SearchTrace {
    /// Steps in the order of their first mark.
    pub steps: Vec<TraceStep>,
    /// Host time from the trace's start to its end, µs.
    pub wall_us: f64,
    /// Device time from the first event to the last, µs (0 without
    /// events): `wall_us` less this is what the host adds on the critical
    /// path.
    pub gpu_span_us: f64,
}

/// A trace in progress on this thread.
struct Recorder {
    started: Instant,
    last: Instant,
    host: Vec<(&'static str, Duration)>,
    /// Events in the order recorded (one stream: they complete in order).
    events: Vec<(&'static str, CudaEvent)>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Whether [`TRACE_VAR`] asks for a trace (default off); `Err` with a
/// value the switch does not take.
pub fn enabled_by_env() -> Result<bool, String> {
    crate::switch::switch_by_env(TRACE_VAR, false)
}

/// Starts a trace on this thread (replacing one left unfinished).
pub(crate) fn start() {
    let now = Instant::now();
    ACTIVE.with(|a| {
        *a.borrow_mut() = Some(Recorder {
            started: now,
            last: now,
            host: Vec::new(),
            events: Vec::new(),
        })
    });
}

/// Attributes the host time since the last mark to `step`. A no-op without
/// a trace.
pub(crate) fn mark(step: &'static str) {
    ACTIVE.with(|a| {
        if let Some(r) = a.borrow_mut().as_mut() {
            let now = Instant::now();
            r.host.push((step, now - r.last));
            r.last = now;
        }
    });
}

/// [`mark`], and an event on `stream` after the work queued so far, which
/// times `step`'s device work. Without a trace nothing is recorded; an event
/// the driver refuses is left out (the trace is a diagnostic).
pub(crate) fn mark_device(step: &'static str, stream: &Arc<CudaStream>) {
    let active = ACTIVE.with(|a| a.borrow().is_some());
    if !active {
        return;
    }
    // Timing events: cudarc's default (`None`) is CU_EVENT_DISABLE_TIMING,
    // whose cuEventElapsedTime fails, which left every step's device time
    // unknown.
    let event = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .ok();
    mark(step);
    ACTIVE.with(|a| {
        if let (Some(r), Some(e)) = (a.borrow_mut().as_mut(), event) {
            r.events.push((step, e));
        }
    });
}

/// Ends this thread's trace: `None` where none was started. Waits for the
/// last event (the search has waited for its results already).
pub(crate) fn finish() -> Option<SearchTrace> {
    let r = ACTIVE.with(|a| a.borrow_mut().take())?;
    let wall = r.last.max(Instant::now()) - r.started;
    if let Some((_, last)) = r.events.last() {
        let _ = last.synchronize();
    }
    let gpu: Vec<(&'static str, f64)> = r
        .events
        .windows(2)
        .map(|w| {
            let ms = w[0].1.elapsed_ms(&w[1].1).unwrap_or(f32::NAN);
            (w[1].0, f64::from(ms) * 1e3)
        })
        .collect();
    let gpu_span_us = gpu
        .iter()
        .map(|(_, us)| *us)
        .filter(|us| us.is_finite())
        .fold(0.0, |a, b| a + b);
    Some(SearchTrace {
        steps: summarize(&r.host, &gpu),
        wall_us: wall.as_secs_f64() * 1e6,
        gpu_span_us,
    })
}

/// Host marks and device intervals added up per step name, in the order of
/// each name's first host mark.
fn summarize(host: &[(&'static str, Duration)], gpu: &[(&'static str, f64)]) -> Vec<TraceStep> {
    let mut steps: Vec<TraceStep> = Vec::new();
    for &(name, d) in host {
        match steps.iter_mut().find(|s| s.step == name) {
            Some(s) => {
                s.count += 1;
                s.host_us += d.as_secs_f64() * 1e6;
            }
            None => steps.push(TraceStep {
                step: name,
                count: 1,
                host_us: d.as_secs_f64() * 1e6,
                gpu_us: None,
            }),
        }
    }
    for &(name, us) in gpu {
        if let Some(s) = steps.iter_mut().find(|s| s.step == name) {
            *s.gpu_us.get_or_insert(0.0) += us;
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_add_up_per_name_in_first_mark_order() {
        let us = Duration::from_micros;
        let host = [
            ("plan", us(5)),
            ("launch", us(3)),
            ("download", us(40)),
            ("launch", us(2)),
        ];
        let gpu = [("launch", 100.0), ("launch", 50.0)];
        let s = summarize(&host, &gpu);
        let names: Vec<_> = s.iter().map(|t| (t.step, t.count)).collect();
        assert_eq!(names, [("plan", 1), ("launch", 2), ("download", 1)]);
        assert_eq!(s[1].host_us, 5.0);
        assert_eq!(s[1].gpu_us, Some(150.0));
        assert_eq!(s[0].gpu_us, None);
    }

    #[test]
    fn marks_without_a_trace_do_nothing_and_a_trace_times_its_marks() {
        mark("nothing");
        assert_eq!(finish(), None);
        start();
        mark("a");
        std::thread::sleep(Duration::from_millis(2));
        mark("b");
        let t = finish().unwrap();
        assert_eq!(t.steps.len(), 2);
        assert!(t.steps[1].host_us >= 2000.0, "{t:?}");
        assert!(t.wall_us >= t.steps[1].host_us);
        assert_eq!(t.gpu_span_us, 0.0);
        // Finished: the next mark is a no-op again.
        mark("c");
        assert_eq!(finish(), None);
    }
}

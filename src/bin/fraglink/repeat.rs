//! `fraglink search --repeat N`: the same search N times in one process.
//!
//! A single search of a few milliseconds, timed once in a fresh process, is
//! mostly the process's first-time costs (thread start-up, first-touch page
//! faults of fresh heap, cold caches), not what a long-running service sees.
//! Peers measured in-process after their build (faiss) have paid those costs
//! already. With `--repeat` the search runs N times and the report gives the
//! median (the figure QPS is computed from), the fastest and the first run,
//! so both the warm and the cold cost are visible. Every repetition must give
//! the same neighbours (the searches are deterministic); a difference is an
//! error, never averaged over.

use serde_json::{json, Value};

/// Most repetitions `--repeat` accepts (each holds nothing beyond its time,
/// but a typo such as 1000000 should not run for hours).
pub const MAX_REPEAT: usize = 1000;

/// Seconds of each repetition, in run order (at least one).
#[derive(Debug, Clone)]
pub struct Timings {
    runs: Vec<f64>,
}

impl Timings {
    pub fn first(&self) -> f64 {
        self.runs[0]
    }

    pub fn min(&self) -> f64 {
        self.runs.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The median (the mean of the middle two for an even count).
    pub fn median(&self) -> f64 {
        let mut s = self.runs.clone();
        s.sort_by(f64::total_cmp);
        let m = s.len() / 2;
        if s.len() % 2 == 1 {
            s[m]
        } else {
            (s[m - 1] + s[m]) / 2.0
        }
    }

    /// `repeat`, `search_ms_first`, `search_ms_min` and every run's ms, for
    /// the `--json` report (its `search_ms` is the [median](Self::median)).
    pub fn json_fields(&self) -> [(&'static str, Value); 4] {
        [
            ("repeat", json!(self.runs.len())),
            ("search_ms_first", json!(self.first() * 1e3)),
            ("search_ms_min", json!(self.min() * 1e3)),
            (
                "search_ms_runs",
                json!(self.runs.iter().map(|s| s * 1e3).collect::<Vec<_>>()),
            ),
        ]
    }

    /// The text report's timing line: the median, and the rest when there
    /// was more than one run.
    pub fn describe(&self) -> String {
        if self.runs.len() == 1 {
            return format!("{:.1} ms", self.first() * 1e3);
        }
        format!(
            "{:.1} ms (median of {}; fastest {:.1} ms, first {:.1} ms)",
            self.median() * 1e3,
            self.runs.len(),
            self.min() * 1e3,
            self.first() * 1e3
        )
    }
}

/// Checks a `--repeat` value.
pub fn check(repeat: usize) -> Result<usize, String> {
    if (1..=MAX_REPEAT).contains(&repeat) {
        Ok(repeat)
    } else {
        Err(format!(
            "--repeat {repeat}: expected 1 to {MAX_REPEAT} repetitions"
        ))
    }
}

/// Runs `search` `times` times (≥ 1). It returns its result and the seconds
/// the search itself took; the first result is kept, and every later one
/// must be `same` as it (`what` names the search in the error).
pub fn repeat<T>(
    times: usize,
    what: &str,
    mut search: impl FnMut() -> Result<(T, f64), String>,
    same: impl Fn(&T, &T) -> bool,
) -> Result<(T, Timings), String> {
    let (first, s) = search()?;
    let mut runs = vec![s];
    for i in 1..times.max(1) {
        let (again, s) = search()?;
        if !same(&again, &first) {
            return Err(format!(
                "{what}: repetition {} of --repeat did not repeat the first (other neighbours, or another route)",
                i + 1
            ));
        }
        runs.push(s);
    }
    Ok((first, Timings { runs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_first_and_the_equality_check() {
        let mut times = [0.004, 0.001, 0.003, 0.002].into_iter();
        let (v, t) = repeat(4, "x", || Ok((7, times.next().unwrap())), PartialEq::eq).unwrap();
        assert_eq!(v, 7);
        assert_eq!(t.first(), 0.004);
        assert_eq!(t.min(), 0.001);
        assert!((t.median() - 0.0025).abs() < 1e-12);
        assert!(t.describe().contains("median of 4"));
        let mut n = 0;
        let e = repeat(
            3,
            "search",
            || {
                n += 1;
                Ok((n.min(2), 0.001))
            },
            PartialEq::eq,
        )
        .unwrap_err();
        assert!(e.contains("repetition 2"), "{e}");
        assert_eq!(
            check(0).unwrap_err(),
            "--repeat 0: expected 1 to 1000 repetitions"
        );
        assert!(check(1001).is_err() && check(5) == Ok(5));
    }
}

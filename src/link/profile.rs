//! Link profiles: the plans a process linked or served, for `fraglink
//! prelink --from` (or [`super::prelink`]) to link ahead of the next run.
//!
//! With `FRAGLINK_PROFILE=FILE` set, the link runtime appends each distinct
//! plan it links or serves (from memory, disk or nvJitLink) to `FILE`, once
//! per process. The variable is read by the first link.
//!
//! # Format (version 1)
//!
//! JSON Lines, UTF-8. The first line is the header, and every process
//! appending to the file writes whole lines with one `write` on a file
//! opened for appending, so concurrent processes interleave lines, never
//! bytes:
//!
//! ```text
//! {"fraglink_profile":1}
//! {"entries":["scan_f32_u32_v4_k32"],"fragments":["scan_f32_u32_v4_k32","metric_l2_f32","filter_none_u32"],"settings":{"opt_level":3,"lineinfo":false,"max_registers":null,"split_compile":null,"fast_compile":null,"ftz":null,"prec_div":null,"prec_sqrt":null,"fma":null},"arch":"sm_90"}
//! {"note":"skipped `my_kernel` for sm_90: run-time source fragments (`my_metric`) are not recorded; link them at run time"}
//! ```
//!
//! * `entries` are the kernel symbols one link serves (lowered names for
//!   name expressions), `fragments` catalog names in link order, `settings`
//!   [`PlanSettings`], `arch` `sm_XX` (with its `a`/`f` variant, if any);
//! * a plan with run-time source fragments ([`Planner::add_source`]) is not
//!   recorded (its source is not in any catalog): a `note` line says so;
//! * a reader skips `note` lines and repeated header lines (two processes
//!   creating the file at once may both write one), and refuses anything else
//!   it does not know, naming the file and line.
//!
//! An existing file that does not start with a fraglink profile header is
//! never appended to (a warning says why and profiling is off).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::build::arch::{Arch, ArchError};
use crate::fragment::FragmentInfo;

use super::key::LinkKey;
use super::planner::{PlanSettings, Planner};
use super::LinkError;

/// Environment variable: the profile file to append to.
pub const ENV_PROFILE: &str = "FRAGLINK_PROFILE";
/// The format version this build writes and reads.
pub const PROFILE_FORMAT: u32 = 1;
/// The largest profile a reader accepts (about 200 000 plans).
pub const MAX_PROFILE_BYTES: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("profile {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("profile {}: {size} bytes, more than the {max} a profile may have", path.display())]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("profile {}: line {line}: {reason}", path.display())]
    Invalid {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// One recorded plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfiledPlan {
    pub entries: Vec<String>,
    pub fragments: Vec<String>,
    pub settings: PlanSettings,
    pub arch: String,
}

impl ProfiledPlan {
    /// The record of `plan` linked for `arch`; `Err` (the note to write)
    /// when the plan has run-time sources.
    pub fn of(plan: &Planner, arch: Arch) -> Result<Self, String> {
        if !plan.sources().is_empty() {
            let names: Vec<String> = plan
                .sources()
                .iter()
                .map(|(n, _)| format!("`{n}`"))
                .collect();
            return Err(format!(
                "skipped `{}` for {arch}: run-time source fragments ({}) are not recorded; \
                 link them at run time",
                plan.entry(),
                names.join(", ")
            ));
        }
        Ok(ProfiledPlan {
            entries: plan.entries().to_vec(),
            fragments: plan
                .static_fragments()
                .iter()
                .map(|f| f.name.to_string())
                .collect(),
            settings: plan.settings().clone(),
            arch: arch.to_string(),
        })
    }

    /// The recorded architecture.
    pub fn arch(&self) -> Result<Arch, ArchError> {
        Arch::parse(&self.arch, "a profiled plan").map(Arch::real)
    }

    /// The plan again, its fragments found by name in `catalog`.
    pub fn planner_in(
        &self,
        catalog: &'static [&'static FragmentInfo],
    ) -> Result<Planner, LinkError> {
        let mut plan = Planner::empty();
        for entry in &self.entries {
            plan = plan.with_entry(entry.clone());
        }
        for name in &self.fragments {
            plan = plan.add_named_in(catalog, name)?;
        }
        Ok(plan.with_settings(&self.settings))
    }

    /// [`planner_in`](Self::planner_in) fraglink's own catalog.
    pub fn planner(&self) -> Result<Planner, LinkError> {
        self.planner_in(&crate::fragments::CATALOG)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    fraglink_profile: u32,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Line {
    Header(Header),
    Note {
        #[allow(dead_code)]
        note: String,
    },
    Plan(ProfiledPlan),
}

fn header_line() -> String {
    let h = Header {
        fraglink_profile: PROFILE_FORMAT,
    };
    format!(
        "{}\n",
        serde_json::to_string(&h).expect("a header serialises")
    )
}

/// Reads a profile: its distinct plans, in first-seen order.
pub fn read(path: &Path) -> Result<Vec<ProfiledPlan>, ProfileError> {
    let io = |source| ProfileError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    if size > MAX_PROFILE_BYTES {
        return Err(ProfileError::TooLarge {
            path: path.to_path_buf(),
            size,
            max: MAX_PROFILE_BYTES,
        });
    }
    // `take` bounds the read even if the file grows meanwhile.
    let reader = BufReader::new(file.take(MAX_PROFILE_BYTES));
    let invalid = |line: usize, reason: String| ProfileError::Invalid {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut seen = HashSet::new();
    let mut plans = Vec::new();
    for (i, text) in reader.lines().enumerate() {
        let n = i + 1;
        let text = text.map_err(|e| invalid(n, e.to_string()))?;
        if text.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(&text).map_err(|_| {
            invalid(
                n,
                "not a header, plan or note line of a fraglink profile".to_string(),
            )
        })?;
        match line {
            Line::Header(h) if h.fraglink_profile == PROFILE_FORMAT => {}
            Line::Header(h) => {
                return Err(invalid(
                    n,
                    format!(
                        "format version {}, this fraglink reads version {PROFILE_FORMAT}",
                        h.fraglink_profile
                    ),
                ))
            }
            _ if n == 1 => {
                return Err(invalid(
                    n,
                    format!("missing the header {}", header_line().trim()),
                ))
            }
            Line::Note { .. } => {}
            Line::Plan(p) => {
                if seen.insert(p.clone()) {
                    plans.push(p);
                }
            }
        }
    }
    Ok(plans)
}

/// Appends plans to a profile file (the runtime's side).
pub struct ProfileWriter {
    path: PathBuf,
    file: Mutex<File>,
    /// Keys already recorded (or noted) by this process.
    recorded: Mutex<HashSet<LinkKey>>,
}

impl ProfileWriter {
    /// Opens `path` for appending, creating it with a header, or checking
    /// the header of an existing file (a file of something else is refused,
    /// never appended to).
    pub fn open(path: &Path) -> Result<Self, ProfileError> {
        let io = |source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(io)?;
        if file.metadata().map_err(io)?.len() == 0 {
            file.write_all(header_line().as_bytes()).map_err(io)?;
        } else {
            // The first line, read from a separate handle (the append handle's
            // position is irrelevant to its writes).
            let mut first = String::new();
            BufReader::new(File::open(path).map_err(io)?.take(4096))
                .read_line(&mut first)
                .map_err(io)?;
            match serde_json::from_str::<Header>(first.trim()) {
                Ok(h) if h.fraglink_profile == PROFILE_FORMAT => {}
                Ok(h) => {
                    return Err(ProfileError::Invalid {
                        path: path.to_path_buf(),
                        line: 1,
                        reason: format!(
                            "format version {}, this fraglink writes version \
                             {PROFILE_FORMAT}; use another file",
                            h.fraglink_profile
                        ),
                    })
                }
                Err(_) => {
                    return Err(ProfileError::Invalid {
                        path: path.to_path_buf(),
                        line: 1,
                        reason: "not a fraglink profile; refusing to append to it".into(),
                    })
                }
            }
        }
        Ok(ProfileWriter {
            path: path.to_path_buf(),
            file: Mutex::new(file),
            recorded: Mutex::new(HashSet::new()),
        })
    }

    /// The profile from `FRAGLINK_PROFILE`: `None` when unset or empty, or
    /// (with a warning) when the file cannot be used; profiling never fails
    /// a link.
    pub fn from_env() -> Option<Self> {
        let path = std::env::var_os(ENV_PROFILE).filter(|p| !p.is_empty())?;
        match Self::open(Path::new(&path)) {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("fraglink: warning: {e}; {ENV_PROFILE} ignored");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `plan` for `arch` once per key in this process.
    pub fn record(&self, key: LinkKey, plan: &Planner, arch: Arch) {
        if !self
            .recorded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key)
        {
            return;
        }
        let line = match ProfiledPlan::of(plan, arch) {
            Ok(p) => serde_json::to_string(&p),
            Err(note) => serde_json::to_string(&serde_json::json!({ "note": note })),
        };
        let mut line = line.expect("plain data serialises");
        line.push('\n');
        // One write of a whole line on an append handle.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!(
                "fraglink: warning: profile {}: {e}; plan `{}` not recorded",
                self.path.display(),
                plan.entry()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Planner {
        Planner::new("scan_f32_u32_v4_k32")
            .add_named("scan_f32_u32_v4_k32")
            .unwrap()
            .add_named("metric_l2_f32")
            .unwrap()
            .max_registers(64)
    }

    #[test]
    fn written_plans_read_back_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let w = ProfileWriter::open(&path).unwrap();
        let key = LinkKey::new(&["e"], &[], &[], (12, 9));
        let other = LinkKey::new(&["f"], &[], &[], (12, 9));
        w.record(key, &plan(), Arch::sm(90));
        w.record(key, &plan(), Arch::sm(90));
        let with_source = plan().add_source("mine", "// nothing");
        w.record(other, &with_source, Arch::sm(90));
        drop(w);
        // A second process appends to the same file; the reader dedups.
        let w = ProfileWriter::open(&path).unwrap();
        w.record(key, &plan(), Arch::sm(90));
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        assert!(text.starts_with("{\"fraglink_profile\":1}\n"), "{text}");
        assert!(
            text.contains("run-time source fragments (`mine`)"),
            "{text}"
        );
        let plans = read(&path).unwrap();
        assert_eq!(plans.len(), 1);
        let p = &plans[0];
        assert_eq!(p.arch().unwrap(), Arch::sm(90));
        let again = p.planner().unwrap();
        assert_eq!(again.fragment_names(), plan().fragment_names());
        assert_eq!(again.settings(), plan().settings());
        assert_eq!(again.entries(), ["scan_f32_u32_v4_k32"]);
    }

    #[test]
    fn a_foreign_file_is_never_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notes.txt");
        std::fs::write(&path, "my notes\n").unwrap();
        let e = ProfileWriter::open(&path).err().unwrap().to_string();
        assert!(e.contains("not a fraglink profile"), "{e}");
        assert!(e.contains("notes.txt"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "my notes\n");
        std::fs::write(&path, "{\"fraglink_profile\":7}\n").unwrap();
        let e = ProfileWriter::open(&path).err().unwrap().to_string();
        assert!(e.contains("version 7"), "{e}");
    }

    #[test]
    fn bad_profiles_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let cases = [
            ("", None),
            ("{\"entries\":[\"e\"]}\n", Some("line 1: not a header")),
            ("{\"note\":\"n\"}\n", Some("line 1: missing the header")),
            (
                "{\"fraglink_profile\":2}\n",
                Some("line 1: format version 2"),
            ),
            (
                "{\"fraglink_profile\":1}\n{\"entries\":[\"e\"],\"fragments\":[]",
                Some("line 2: not a header"),
            ),
            (
                "{\"fraglink_profile\":1}\n{\"fraglink_profile\":1}\n{\"note\":\"x\"}\n\n",
                None,
            ),
        ];
        for (text, want) in cases {
            std::fs::write(&path, text).unwrap();
            match (read(&path), want) {
                (Ok(plans), None) => assert!(plans.is_empty()),
                (Err(e), Some(w)) => {
                    let e = e.to_string();
                    assert!(e.contains(w) && e.contains("p.jsonl"), "{e}")
                }
                (r, w) => panic!("{text:?}: {r:?}, wanted {w:?}"),
            }
        }
        let missing = read(&dir.path().join("absent")).unwrap_err().to_string();
        assert!(missing.contains("absent"), "{missing}");
    }
}

//! GPU architectures as the build and the linker name them.

use std::fmt;

/// `compute_75` (LTO-IR that links for any `sm_YY` with YY ≥ 75) or `sm_90`
/// (LTO-IR tuned for one real architecture).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Compute capability times ten: 75, 80, 90, 100, …
    pub number: u32,
    /// `compute_XX` rather than `sm_XX`.
    pub virtual_arch: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid architecture `{given}` in {origin}: expected sm_XX, compute_XX or XX (XX ≥ 50, e.g. sm_90, compute_75)")]
pub struct ArchError {
    pub given: String,
    pub origin: String,
}

impl Arch {
    pub const fn sm(number: u32) -> Self {
        Arch {
            number,
            virtual_arch: false,
        }
    }
    pub const fn compute(number: u32) -> Self {
        Arch {
            number,
            virtual_arch: true,
        }
    }

    /// Parses `sm_90`, `compute_75`, `90`, `sm_90a`-style suffixes are not
    /// accepted (LTO-IR has no arch-specific variant). `origin` names where the
    /// text came from, for the error.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ArchError> {
        let t = text.trim();
        let (virtual_arch, digits) = if let Some(d) = t.strip_prefix("compute_") {
            (true, d)
        } else if let Some(d) = t.strip_prefix("sm_") {
            (false, d)
        } else {
            (false, t)
        };
        match digits.parse::<u32>() {
            Ok(n) if (50..1000).contains(&n) && digits.chars().all(|c| c.is_ascii_digit()) => {
                Ok(Arch {
                    number: n,
                    virtual_arch,
                })
            }
            _ => Err(ArchError {
                given: text.into(),
                origin: origin.into(),
            }),
        }
    }

    /// A comma-separated list, e.g. `FRAGLINK_ARCHS=compute_75,sm_90`.
    pub fn parse_list(text: &str, origin: &str) -> Result<Vec<Self>, ArchError> {
        let mut out: Vec<Arch> = Vec::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let a = Arch::parse(part, origin)?;
            if !out.contains(&a) {
                out.push(a);
            }
        }
        if out.is_empty() {
            return Err(ArchError {
                given: text.into(),
                origin: origin.into(),
            });
        }
        Ok(out)
    }

    /// The default: a base that links on every GPU CUDA 12.9 supports without
    /// deprecation (Turing and newer), plus Hopper-tuned LTO-IR.
    pub fn defaults() -> Vec<Self> {
        vec![Arch::compute(75), Arch::sm(90)]
    }

    /// Whether LTO-IR built for `self` can be linked for the real `target`.
    pub fn links_for(&self, target: Arch) -> bool {
        if self.virtual_arch {
            target.number >= self.number
        } else {
            target.number == self.number
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.virtual_arch { "compute" } else { "sm" };
        write!(f, "{prefix}_{}", self.number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_forms() {
        assert_eq!(Arch::parse("sm_90", "t").unwrap(), Arch::sm(90));
        assert_eq!(Arch::parse("compute_75", "t").unwrap(), Arch::compute(75));
        assert_eq!(Arch::parse("80", "t").unwrap(), Arch::sm(80));
        assert!(Arch::parse("sm_90a", "t").is_err());
        assert!(Arch::parse("sm_5", "t").is_err());
        let e = Arch::parse("gfx90", "FRAGLINK_ARCHS")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gfx90") && e.contains("FRAGLINK_ARCHS"), "{e}");
    }

    #[test]
    fn list_dedups_and_rejects_empty() {
        let l = Arch::parse_list("compute_75, sm_90,sm_90", "t").unwrap();
        assert_eq!(l, vec![Arch::compute(75), Arch::sm(90)]);
        assert!(Arch::parse_list(" , ", "t").is_err());
    }

    #[test]
    fn compatibility() {
        assert!(Arch::compute(75).links_for(Arch::sm(90)));
        assert!(!Arch::compute(80).links_for(Arch::sm(75)));
        assert!(Arch::sm(90).links_for(Arch::sm(90)));
        assert!(!Arch::sm(90).links_for(Arch::sm(100)));
    }
}

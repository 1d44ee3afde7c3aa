//! GPU architectures as the build and the linker name them.
//!
//! Besides the portable `compute_XX` / `sm_XX`, CUDA has arch-specific
//! targets: `sm_90a` (features of exactly that chip, e.g. Hopper's wgmma)
//! and, from 12.9, family-specific ones such as `sm_120f` (features shared by
//! one family, 12.x). IR built for a variant links only where that variant
//! runs, and the variant is part of every link key: cuDF once served an
//! `sm_90` cubin for an `sm_90a` request (cudf#23506).

use std::fmt;

/// Which flavour of an architecture number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Variant {
    /// `sm_90`: runs on this and (as `compute_XX`) every later GPU.
    #[default]
    Portable,
    /// `sm_90a`: this exact architecture only.
    Specific,
    /// `sm_120f`: every architecture of this family (same major).
    Family,
}

impl Variant {
    fn suffix(self) -> &'static str {
        match self {
            Variant::Portable => "",
            Variant::Specific => "a",
            Variant::Family => "f",
        }
    }
}

/// `compute_75` (LTO-IR that links for any `sm_YY` with YY ≥ 75) or `sm_90`
/// (LTO-IR tuned for one real architecture), possibly arch- or
/// family-specific (`sm_90a`, `compute_120f`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Compute capability times ten: 75, 80, 90, 100, …
    pub number: u32,
    /// `compute_XX` rather than `sm_XX`.
    pub virtual_arch: bool,
    /// `a` / `f` suffix.
    pub variant: Variant,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid architecture `{given}` in {origin}: expected sm_XX, compute_XX or XX, optionally with an `a` (arch-specific) or `f` (family-specific) suffix (XX ≥ 50, e.g. sm_90, compute_75, sm_90a, sm_120f)")]
pub struct ArchError {
    pub given: String,
    pub origin: String,
}

impl Arch {
    pub const fn sm(number: u32) -> Self {
        Arch {
            number,
            virtual_arch: false,
            variant: Variant::Portable,
        }
    }
    pub const fn compute(number: u32) -> Self {
        Arch {
            number,
            virtual_arch: true,
            variant: Variant::Portable,
        }
    }
    pub const fn with_variant(self, variant: Variant) -> Self {
        Arch { variant, ..self }
    }
    /// The real architecture of the same number and variant (`compute_90a`
    /// → `sm_90a`): what a link targets.
    pub const fn real(self) -> Self {
        Arch {
            virtual_arch: false,
            ..self
        }
    }
    /// The major of the compute capability (`120` → 12): the family.
    pub const fn family(self) -> u32 {
        self.number / 10
    }

    /// Parses `sm_90`, `compute_75`, `90`, `sm_90a`, `compute_120f`.
    /// `origin` names where the text came from, for the error. Family
    /// variants exist from Blackwell (100) on.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ArchError> {
        let err = || ArchError {
            given: text.into(),
            origin: origin.into(),
        };
        let t = text.trim();
        let (virtual_arch, rest) = if let Some(d) = t.strip_prefix("compute_") {
            (true, d)
        } else if let Some(d) = t.strip_prefix("sm_") {
            (false, d)
        } else {
            (false, t)
        };
        let (digits, variant) = match rest.strip_suffix('a') {
            Some(d) => (d, Variant::Specific),
            None => match rest.strip_suffix('f') {
                Some(d) => (d, Variant::Family),
                None => (rest, Variant::Portable),
            },
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            return Err(err());
        }
        match digits.parse::<u32>() {
            Ok(n) if (50..1000).contains(&n) => {
                // `a` targets exist from sm_90, `f` from sm_100.
                let ok = match variant {
                    Variant::Portable => true,
                    Variant::Specific => n >= 90,
                    Variant::Family => n >= 100,
                };
                if !ok {
                    return Err(err());
                }
                Ok(Arch {
                    number: n,
                    virtual_arch,
                    variant,
                })
            }
            _ => Err(err()),
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

    /// The default: `compute_75` (every GPU CUDA 12.9 supports without
    /// deprecation, Turing and newer), `compute_80` and Hopper-tuned `sm_90`.
    ///
    /// Why `compute_80` was added (issue 14): bf16 arithmetic and `cp.async`
    /// exist from sm_80, and with only `compute_75,sm_90` the kernels behind
    /// `#if __CUDA_ARCH__ >= 800` vanished from the compute_75 IR that
    /// nvJitLink picked for sm_80–sm_89 (160 bf16 kernels lost in one
    /// library). cuVS builds a single base arch; dropping compute_75 instead
    /// would have lost Turing. The cost is one more LTO-IR per fragment:
    /// the README's "Architectures" section gives the bytes for fraglink's
    /// own fragments.
    pub fn defaults() -> Vec<Self> {
        vec![Arch::compute(75), Arch::compute(80), Arch::sm(90)]
    }

    /// Whether LTO-IR built for `self` can be linked for the real `target`.
    pub fn links_for(&self, target: Arch) -> bool {
        match self.variant {
            // Arch-specific IR needs exactly that chip and variant.
            Variant::Specific => {
                target.number == self.number && target.variant == Variant::Specific
            }
            // Family IR: the same family, at this number or later.
            Variant::Family => {
                target.family() == self.family()
                    && target.number >= self.number
                    && target.variant != Variant::Portable
            }
            Variant::Portable if self.virtual_arch => target.number >= self.number,
            Variant::Portable => target.number == self.number,
        }
    }

    /// Which of `built` nvJitLink uses when linking for `target`: the most
    /// specific one that links (exact variant first, then a real arch, then
    /// the newest virtual one), `None` when none does.
    pub fn chosen_for(built: &[Arch], target: Arch) -> Option<Arch> {
        built
            .iter()
            .copied()
            .filter(|b| b.links_for(target))
            .max_by_key(|b| (b.variant == target.variant, !b.virtual_arch, b.number))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = if self.virtual_arch { "compute" } else { "sm" };
        write!(f, "{prefix}_{}{}", self.number, self.variant.suffix())
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
        assert!(Arch::parse("sm_5", "t").is_err());
        let e = Arch::parse("gfx90", "FRAGLINK_ARCHS")
            .unwrap_err()
            .to_string();
        assert!(e.contains("gfx90") && e.contains("FRAGLINK_ARCHS"), "{e}");
    }

    #[test]
    fn arch_specific_targets_parse_and_print() {
        for (text, number, variant) in [
            ("sm_90a", 90, Variant::Specific),
            ("sm_100a", 100, Variant::Specific),
            ("sm_120f", 120, Variant::Family),
            ("compute_100f", 100, Variant::Family),
        ] {
            let a = Arch::parse(text, "t").unwrap();
            assert_eq!((a.number, a.variant), (number, variant), "{text}");
            assert_eq!(a.to_string(), text);
        }
        // `a` from Hopper, `f` from Blackwell; nothing else.
        for bad in ["sm_80a", "sm_90f", "sm_90x", "sm_a", "sm_90af"] {
            assert!(Arch::parse(bad, "t").is_err(), "{bad}");
        }
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
        let sm90a = Arch::sm(90).with_variant(Variant::Specific);
        assert!(sm90a.links_for(sm90a));
        assert!(!sm90a.links_for(Arch::sm(90)), "sm_90a IR on a plain sm_90");
        assert!(Arch::sm(90).links_for(sm90a), "portable IR runs on sm_90a");
        let f = Arch::compute(120).with_variant(Variant::Family);
        assert!(f.links_for(Arch::sm(121).with_variant(Variant::Family)));
        assert!(!f.links_for(Arch::sm(100).with_variant(Variant::Family)));
    }

    #[test]
    fn chosen_ir_prefers_the_most_specific() {
        let built = [Arch::compute(75), Arch::sm(90), Arch::compute(80)];
        assert_eq!(
            Arch::chosen_for(&built, Arch::sm(86)),
            Some(Arch::compute(80))
        );
        assert_eq!(Arch::chosen_for(&built, Arch::sm(90)), Some(Arch::sm(90)));
        assert_eq!(Arch::chosen_for(&built, Arch::sm(70)), None);
        let sm90a = Arch::sm(90).with_variant(Variant::Specific);
        let with_a = [Arch::compute(80), Arch::sm(90), sm90a];
        assert_eq!(Arch::chosen_for(&with_a, sm90a), Some(sm90a));
        assert_eq!(Arch::chosen_for(&with_a, Arch::sm(90)), Some(Arch::sm(90)));
    }

    #[test]
    fn defaults_cover_bf16_guards() {
        let d = Arch::defaults();
        assert_eq!(Arch::chosen_for(&d, Arch::sm(86)), Some(Arch::compute(80)));
        assert_eq!(Arch::chosen_for(&d, Arch::sm(75)), Some(Arch::compute(75)));
    }
}

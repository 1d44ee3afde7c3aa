//! The link key: everything that decides the bytes of a cubin (DESIGN.md 6).
//! cuVS keys on fragment names only, so one process that sees two GPU
//! generations (or two option sets) gets the wrong cubin; this key cannot.

use std::fmt;

/// Bumped when the key's recipe changes (v2: a set of entries).
const KEY_FORMAT: &str = "fraglink-link-key-v2";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LinkKey([u8; 32]);

/// A key is a BLAKE3 digest, uniformly distributed: its first 8 bytes place
/// it in a hash map as well as all 32 would, for a quarter of the hashing
/// (a memory-cache hit is one such lookup). Equality still compares all 32.
impl std::hash::Hash for LinkKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let head: [u8; 8] = self.0[..8].try_into().expect("32 > 8");
        state.write_u64(u64::from_le_bytes(head));
    }
}

impl LinkKey {
    /// `entries` are the kernels in plan order; `inputs` are `(name,
    /// content hash)` in link order; `options` the complete nvJitLink command
    /// line (arch and its `a`/`f` variant included); `nvjitlink` its version.
    pub fn new(
        entries: &[&str],
        inputs: &[(&str, &str)],
        options: &[String],
        nvjitlink: (u32, u32),
    ) -> Self {
        let mut h = blake3::Hasher::new();
        let mut field = |b: &[u8]| {
            h.update(&(b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(KEY_FORMAT.as_bytes());
        field(&(entries.len() as u64).to_le_bytes());
        for e in entries {
            field(e.as_bytes());
        }
        field(&(inputs.len() as u64).to_le_bytes());
        for (name, hash) in inputs {
            field(name.as_bytes());
            field(hash.as_bytes());
        }
        field(&(options.len() as u64).to_le_bytes());
        for o in options {
            field(o.as_bytes());
        }
        field(format!("nvjitlink {}.{}", nvjitlink.0, nvjitlink.1).as_bytes());
        LinkKey(*h.finalize().as_bytes())
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for LinkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LinkKey({})", &self.hex()[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entry: &str, inputs: &[(&str, &str)], arch: &str, v: (u32, u32)) -> LinkKey {
        LinkKey::new(
            &[entry],
            inputs,
            &["-lto".into(), format!("-arch={arch}")],
            v,
        )
    }

    #[test]
    fn every_ingredient_changes_the_key() {
        let base = key("e", &[("a", "h1"), ("b", "h2")], "sm_80", (12, 9));
        assert_eq!(
            base,
            key("e", &[("a", "h1"), ("b", "h2")], "sm_80", (12, 9))
        );
        assert_ne!(
            base,
            key("f", &[("a", "h1"), ("b", "h2")], "sm_80", (12, 9))
        );
        assert_ne!(
            base,
            key("e", &[("b", "h2"), ("a", "h1")], "sm_80", (12, 9)),
            "order matters"
        );
        assert_ne!(
            base,
            key("e", &[("a", "h1"), ("b", "h3")], "sm_80", (12, 9)),
            "content"
        );
        assert_ne!(
            base,
            key("e", &[("a", "h1"), ("b", "h2")], "sm_90", (12, 9)),
            "arch"
        );
        assert_ne!(
            base,
            key("e", &[("a", "h1"), ("b", "h2")], "sm_80", (12, 8)),
            "version"
        );
        assert_ne!(
            base,
            key("e", &[("a", "h1"), ("b", "h2")], "sm_90a", (12, 9)),
            "arch-specific variant"
        );
        let two = |entries: &[&str]| {
            LinkKey::new(entries, &[("a", "h1")], &["-arch=sm_80".into()], (12, 9))
        };
        assert_ne!(two(&["e"]), two(&["e", "f"]), "entry set");
        assert_ne!(two(&["e", "f"]), two(&["ef"]), "entry boundaries");
        // Length-prefixed fields: moving a boundary changes the key.
        assert_ne!(
            key("e", &[("ab", "c")], "sm_80", (12, 9)),
            key("e", &[("a", "bc")], "sm_80", (12, 9))
        );
    }

    #[test]
    fn hex_is_64_chars() {
        assert_eq!(key("e", &[], "sm_80", (12, 9)).hex().len(), 64);
    }
}

//! The link key of a plan, remembered per runtime and architecture.
//!
//! Computing a [`LinkKey`] hashes every fragment's name and content hash and
//! the whole nvJitLink command line, and building that command line
//! allocates: about a microsecond, which used to be most of a memory-cache
//! hit. A plan's content cannot change once built (every builder method
//! makes a fresh memo), and what else the key depends on (nvJitLink's and
//! NVRTC's versions, CUDA's include directories for run-time sources) is
//! fixed for the life of one [`LinkRuntime`](super::LinkRuntime). So a key is
//! remembered under (runtime id, arch) and a repeated link is one
//! lock-free slot scan followed by one hash lookup in the memory cache.

use std::fmt;
use std::sync::OnceLock;

use crate::build::arch::Arch;

use super::key::LinkKey;

/// (runtime, arch) pairs remembered per plan. A plan linked for more
/// combinations than this still links correctly; the extra ones recompute
/// their key on every call.
const SLOTS: usize = 4;

#[derive(Clone, Copy)]
struct Remembered {
    runtime: u64,
    arch: Arch,
    key: LinkKey,
}

/// Lock-free: each slot is written once, and readers never wait.
#[derive(Default)]
pub(crate) struct KeyMemo {
    slots: [OnceLock<Remembered>; SLOTS],
}

impl KeyMemo {
    /// The key remembered for `runtime` and `arch`, if any.
    #[inline]
    pub(crate) fn get(&self, runtime: u64, arch: Arch) -> Option<LinkKey> {
        for slot in &self.slots {
            match slot.get() {
                Some(r) if r.runtime == runtime && r.arch == arch => return Some(r.key),
                Some(_) => continue,
                // Slots fill in order: an empty one ends the search.
                None => return None,
            }
        }
        None
    }

    /// Remembers `key`; a no-op once every slot is taken. Two threads
    /// racing for one slot both keep a correct key: the loser moves on.
    pub(crate) fn remember(&self, runtime: u64, arch: Arch, key: LinkKey) {
        let new = Remembered { runtime, arch, key };
        for slot in &self.slots {
            let r = slot.get_or_init(|| new);
            if r.runtime == runtime && r.arch == arch {
                return;
            }
        }
    }
}

impl fmt::Debug for KeyMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let filled = self.slots.iter().filter(|s| s.get().is_some()).count();
        write!(f, "KeyMemo({filled}/{SLOTS})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> LinkKey {
        LinkKey::new(&[&format!("e{n}")], &[], &[], (12, 9))
    }

    #[test]
    fn remembers_per_runtime_and_arch() {
        let m = KeyMemo::default();
        assert_eq!(m.get(1, Arch::sm(80)), None);
        m.remember(1, Arch::sm(80), key(1));
        m.remember(1, Arch::sm(90), key(2));
        m.remember(2, Arch::sm(80), key(3));
        assert_eq!(m.get(1, Arch::sm(80)), Some(key(1)));
        assert_eq!(m.get(1, Arch::sm(90)), Some(key(2)));
        assert_eq!(m.get(2, Arch::sm(80)), Some(key(3)));
        assert_eq!(m.get(2, Arch::sm(90)), None);
        // Remembering again keeps one slot per pair.
        m.remember(1, Arch::sm(80), key(1));
        m.remember(3, Arch::sm(75), key(4));
        assert_eq!(m.get(3, Arch::sm(75)), Some(key(4)));
        // Full: further pairs are simply not remembered.
        m.remember(4, Arch::sm(75), key(5));
        assert_eq!(m.get(4, Arch::sm(75)), None);
        assert_eq!(format!("{m:?}"), "KeyMemo(4/4)");
    }
}

//! What the generated registry is made of: fragment descriptions and the
//! traits that make a fragment's existence a compile-time fact.

/// One embedded fragment: an LTO-IR fatbin and where it came from.
#[derive(Debug)]
pub struct FragmentInfo {
    pub name: &'static str,
    pub family: &'static str,
    /// Every key of the matrix entry that produced it, values as text.
    pub params: &'static [(&'static str, &'static str)],
    /// Architectures whose LTO-IR the fatbin holds (`compute_75`, `sm_90`).
    pub archs: &'static [&'static str],
    /// nvFatbin output, aligned to 16 bytes.
    pub fatbin: &'static [u8],
    /// blake3 of `fatbin`, hex: the fragment's part of a link key.
    pub hash: &'static str,
    /// The kernels each arch's LTO-IR holds, recorded at build time
    /// (`("compute_80", &["affine_bf16", ...])`): a kernel behind
    /// `#if __CUDA_ARCH__ >= 800` is in compute_80's list, not compute_75's.
    pub entries: &'static [(&'static str, &'static [&'static str])],
    /// Strong external definitions (functions, kernels, variables) over
    /// every arch: two fragments of one link must not share one.
    pub definitions: &'static [&'static str],
    /// `(name expression, mangled name)` of the family's name expressions
    /// (`("quantize<float>", "_Z8quantizeIfEvPKfPai")`).
    pub lowered: &'static [(&'static str, &'static str)],
    /// The real archs (`sm_90`) whose relocatable SASS the fatbin holds
    /// beside the LTO-IR: a plan of such fragments links for exactly that
    /// arch without LTO, in about a millisecond
    /// ([`crate::link::LinkRuntime::link_tiered`]).
    pub sass: &'static [&'static str],
}

impl FragmentInfo {
    pub fn param(&self, key: &str) -> Option<&'static str> {
        self.params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// Whether some LTO-IR of this fragment links for the real arch
    /// `target` (a fragment with a minimum arch has none for older GPUs).
    pub fn links_for(&self, target: crate::build::Arch) -> bool {
        self.archs.iter().any(|a| {
            crate::build::Arch::parse(a, "catalog")
                .map(|b| b.links_for(target))
                .unwrap_or(false)
        })
    }

    /// Whether the fatbin holds relocatable SASS for exactly the real arch
    /// `target` (`sm_90` for sm_90; an `sm_90a` build for sm_90a only).
    pub fn has_sass_for(&self, target: crate::build::Arch) -> bool {
        let target = target.real().to_string();
        self.sass.iter().any(|a| *a == target)
    }

    /// The kernels of the LTO-IR built for `arch` (as named in `archs`).
    pub fn entries_for(&self, arch: &str) -> Option<&'static [&'static str]> {
        self.entries
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|(_, names)| *names)
    }

    /// Every kernel of any arch, each once, in build order.
    pub fn all_entries(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = Vec::new();
        for (_, names) in self.entries {
            for n in *names {
                if !out.contains(n) {
                    out.push(n);
                }
            }
        }
        out
    }

    /// The mangled name recorded for a name expression.
    pub fn lowered_name(&self, expression: &str) -> Option<&'static str> {
        self.lowered
            .iter()
            .find(|(e, _)| *e == expression)
            .map(|(_, l)| *l)
    }
}

/// Implemented by a fragment tag type only when its matrix produced that
/// combination: asking for another one does not compile.
#[diagnostic::on_unimplemented(
    message = "no fragment `{Self}` was built: its matrix does not produce this combination",
    label = "not in the fragment matrices",
    note = "`fraglink catalog` lists the fragments that exist; add the combination to the family's matrix to build it"
)]
pub trait StaticFragment {
    fn info() -> &'static FragmentInfo;
}

/// The description of fragment `F`; `F` must exist (see [`StaticFragment`]).
pub fn info_of<F: StaticFragment>() -> &'static FragmentInfo {
    F::info()
}

/// A zero-sized parameter value (`F32`, `L2`, …).
pub trait Tag: 'static {
    /// The matrix value the tag stands for.
    const VALUE: &'static str;
}

/// Bytes with an alignment nvJitLink and nvFatbin are happy with.
#[repr(C, align(16))]
pub struct AlignedBytes<const N: usize>(pub [u8; N]);

/// Looks a fragment up by name in a catalog.
pub fn find_in(
    catalog: &'static [&'static FragmentInfo],
    name: &str,
) -> Option<&'static FragmentInfo> {
    catalog.iter().copied().find(|f| f.name == name)
}

/// Names in `catalog` closest to `name` (edit distance), best first.
pub fn nearest_names(
    catalog: &'static [&'static FragmentInfo],
    name: &str,
    n: usize,
) -> Vec<&'static str> {
    let names: Vec<&'static str> = catalog.iter().map(|f| f.name).collect();
    nearest(&names, name, n)
}

/// The `n` of `names` closest to `name` (edit distance), best first.
pub fn nearest<'a>(names: &[&'a str], name: &str, n: usize) -> Vec<&'a str> {
    let mut scored: Vec<(usize, &'a str)> =
        names.iter().map(|c| (edit_distance(name, c), *c)).collect();
    scored.sort();
    scored.dedup();
    scored.into_iter().take(n).map(|(_, s)| s).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }
}

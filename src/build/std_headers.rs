//! Stand-ins for the C and C++ standard headers NVRTC lacks (`stdint.h`,
//! `cmath`, `type_traits`, ...), mapped to libcu++ (`cuda/std/...`) like
//! jitify's: on by default for every NVRTC build (`Family::std_headers`
//! turns them off), and given to run-time sources as in-memory headers. The
//! files live in `fragments/std/`; each one says what it maps to.

/// `(include name, contents)` of every stand-in.
pub const STD_HEADERS: &[(&str, &str)] = &[
    ("assert.h", include_str!("../../fragments/std/assert.h")),
    ("cassert", include_str!("../../fragments/std/cassert")),
    ("cfloat", include_str!("../../fragments/std/cfloat")),
    ("climits", include_str!("../../fragments/std/climits")),
    ("cmath", include_str!("../../fragments/std/cmath")),
    ("cstddef", include_str!("../../fragments/std/cstddef")),
    ("cstdint", include_str!("../../fragments/std/cstdint")),
    ("cstdio", include_str!("../../fragments/std/cstdio")),
    ("cstdlib", include_str!("../../fragments/std/cstdlib")),
    ("cstring", include_str!("../../fragments/std/cstring")),
    ("float.h", include_str!("../../fragments/std/float.h")),
    (
        "fraglink_std_namespace.h",
        include_str!("../../fragments/std/fraglink_std_namespace.h"),
    ),
    ("limits", include_str!("../../fragments/std/limits")),
    ("limits.h", include_str!("../../fragments/std/limits.h")),
    ("math.h", include_str!("../../fragments/std/math.h")),
    ("stddef.h", include_str!("../../fragments/std/stddef.h")),
    ("stdint.h", include_str!("../../fragments/std/stdint.h")),
    ("stdio.h", include_str!("../../fragments/std/stdio.h")),
    ("stdlib.h", include_str!("../../fragments/std/stdlib.h")),
    ("string.h", include_str!("../../fragments/std/string.h")),
    (
        "type_traits",
        include_str!("../../fragments/std/type_traits"),
    ),
    ("utility", include_str!("../../fragments/std/utility")),
];

/// Writes the stand-ins into `dir` (created), for `-I`; returns `dir`.
pub fn write_to(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in STD_HEADERS {
        let path = dir.join(name);
        // Unchanged files are not rewritten: their mtime stays, and a
        // concurrent build never reads half a file.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(*text) {
            let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, &path)?;
        }
    }
    Ok(dir.to_path_buf())
}

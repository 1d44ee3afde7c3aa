//! Rendering a family's template once per matrix entry.
//!
//! minijinja runs with strict undefined behaviour; before rendering, the
//! variables a template references are compared with the entry's keys so a
//! missing one is reported by name together with the entry that lacks it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use minijinja::{Environment, UndefinedBehavior};

use super::matrix::Entry;

/// One fragment ready to compile.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub family: String,
    /// Index of the family in the build's list (its compile settings).
    pub family_index: usize,
    pub name: String,
    pub entry: Entry,
    pub source: String,
    /// `-DKEY=value` for every key of the entry (plain-source families).
    pub defines: Vec<String>,
    /// Rendered C++ name expressions (`quantize<float>`) whose mangled names
    /// the build records.
    pub expressions: Vec<String>,
    /// The archs it is compiled for: the build's from its minimum on
    /// ([`super::min_arch`]), set by the builder after rendering; empty means
    /// every arch of the build.
    pub archs: Vec<super::arch::Arch>,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{template}: variable `{variable}` is undefined for matrix entry {entry}")]
    MissingVariable {
        template: String,
        variable: String,
        entry: String,
    },
    #[error("{template}: {message} (matrix entry {entry})")]
    Template {
        template: String,
        message: String,
        entry: String,
    },
    #[error("family `{family}`: the name format renders `{name}`, which is not an identifier ([A-Za-z_][A-Za-z0-9_]*), for matrix entry {entry}")]
    UnsafeName {
        family: String,
        name: String,
        entry: String,
    },
    #[error("fragment name `{name}` is produced twice: by {first} and by {second}; make the name format of the families involved distinguish them")]
    NameClash {
        name: String,
        first: String,
        second: String,
    },
    #[error("family `{family}`: matrix key `{key}` cannot become a -D define of a plain-source family: it is not an identifier")]
    BadDefine { family: String, key: String },
    #[error("family `{family}`: the matrix {matrix} has an empty product (no entries); check for an empty array on every branch (cuVS's CMake reports this as \"incorrect range specification\")")]
    EmptyProduct { family: String, matrix: PathBuf },
}

/// `{"a": "1", "b": 2}`, for error messages.
pub fn entry_display(entry: &Entry) -> String {
    serde_json::to_string(entry).unwrap_or_else(|_| format!("{entry:?}"))
}

pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Renders `template_src` (named `template_name` in errors) with `context`.
fn render_one(
    env: &Environment<'_>,
    template_name: &str,
    context: &BTreeMap<String, serde_json::Value>,
    entry: &Entry,
) -> Result<String, RenderError> {
    let tmpl = env
        .get_template(template_name)
        .map_err(|e| RenderError::Template {
            template: template_name.into(),
            message: format_minijinja(&e),
            entry: entry_display(entry),
        })?;
    let referenced: BTreeSet<String> = tmpl.undeclared_variables(false).into_iter().collect();
    if let Some(variable) = referenced
        .iter()
        .find(|v| !context.contains_key(*v) && env.globals().all(|(g, _)| g != v.as_str()))
    {
        return Err(RenderError::MissingVariable {
            template: template_name.into(),
            variable: variable.clone(),
            entry: entry_display(entry),
        });
    }
    tmpl.render(context).map_err(|e| RenderError::Template {
        template: template_name.into(),
        message: format_minijinja(&e),
        entry: entry_display(entry),
    })
}

fn format_minijinja(e: &minijinja::Error) -> String {
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// A family's inputs, already read from disk.
pub struct FamilySource<'a> {
    pub family: &'a str,
    pub matrix_path: PathBuf,
    pub entries: &'a [Entry],
    /// Name shown in errors (the template's path).
    pub template_name: String,
    pub template: &'a str,
    pub name_format: &'a str,
    /// The template is plain CUDA, compiled as is: no template engine (so
    /// `{{0.0f}}` stays C++), the entry's values arrive as `-D` defines.
    pub plain: bool,
    /// Name expressions, each a minijinja template (`quantize<{{ dtype }}>`).
    pub expressions: &'a [String],
}

/// `-DDTYPE=float` for `{"dtype": "float"}`: keys upper-cased, values as
/// text. A key that is not an identifier cannot be a macro name.
pub fn defines(family: &str, entry: &Entry) -> Result<Vec<String>, RenderError> {
    entry
        .iter()
        .map(|(k, v)| {
            if !is_identifier(k) {
                return Err(RenderError::BadDefine {
                    family: family.into(),
                    key: k.clone(),
                });
            }
            let value = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Ok(format!("-D{}={value}", k.to_ascii_uppercase()))
        })
        .collect()
}

/// Renders every entry of every family, checking names are identifiers and
/// unique across all families.
pub fn render_all(families: &[FamilySource<'_>]) -> Result<Vec<Rendered>, RenderError> {
    let mut out: Vec<Rendered> = Vec::new();
    let mut seen: BTreeMap<String, (String, Entry)> = BTreeMap::new();
    for (family_index, fam) in families.iter().enumerate() {
        if fam.entries.is_empty() {
            return Err(RenderError::EmptyProduct {
                family: fam.family.into(),
                matrix: fam.matrix_path.clone(),
            });
        }
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // Sources are C++: never HTML-escape.
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_keep_trailing_newline(true);
        let name_tmpl = format!("name format of family `{}`", fam.family);
        env.add_template_owned(name_tmpl.clone(), fam.name_format.to_string())
            .map_err(|e| RenderError::Template {
                template: name_tmpl.clone(),
                message: format_minijinja(&e),
                entry: "(none)".into(),
            })?;
        if !fam.plain {
            env.add_template_owned(fam.template_name.clone(), fam.template.to_string())
                .map_err(|e| RenderError::Template {
                    template: fam.template_name.clone(),
                    message: format_minijinja(&e),
                    entry: "(none)".into(),
                })?;
        }
        let expression_names: Vec<String> = (0..fam.expressions.len())
            .map(|i| format!("name expression {i} of family `{}`", fam.family))
            .collect();
        for (name, text) in expression_names.iter().zip(fam.expressions) {
            env.add_template_owned(name.clone(), text.clone())
                .map_err(|e| RenderError::Template {
                    template: name.clone(),
                    message: format_minijinja(&e),
                    entry: "(none)".into(),
                })?;
        }
        for entry in fam.entries {
            let mut ctx: BTreeMap<String, serde_json::Value> = entry.clone();
            ctx.insert("family".into(), fam.family.into());
            let name = render_one(&env, &name_tmpl, &ctx, entry)?
                .trim()
                .to_string();
            if !is_identifier(&name) {
                return Err(RenderError::UnsafeName {
                    family: fam.family.into(),
                    name,
                    entry: entry_display(entry),
                });
            }
            if let Some((first_family, first)) = seen.get(&name) {
                return Err(RenderError::NameClash {
                    name,
                    first: format!("family `{first_family}` entry {}", entry_display(first)),
                    second: format!("family `{}` entry {}", fam.family, entry_display(entry)),
                });
            }
            seen.insert(name.clone(), (fam.family.to_string(), entry.clone()));
            ctx.insert("name".into(), name.clone().into());
            let (source, defines) = if fam.plain {
                (fam.template.to_string(), defines(fam.family, entry)?)
            } else {
                (
                    render_one(&env, &fam.template_name, &ctx, entry)?,
                    Vec::new(),
                )
            };
            let expressions = expression_names
                .iter()
                .map(|t| Ok(render_one(&env, t, &ctx, entry)?.trim().to_string()))
                .collect::<Result<Vec<_>, RenderError>>()?;
            out.push(Rendered {
                family: fam.family.into(),
                family_index,
                name,
                entry: entry.clone(),
                source,
                defines,
                expressions,
                archs: Vec::new(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entries(v: serde_json::Value) -> Vec<Entry> {
        super::super::matrix::expand(&v).unwrap().entries
    }

    fn fam<'a>(entries: &'a [Entry], template: &'a str, name_format: &'a str) -> FamilySource<'a> {
        FamilySource {
            family: "metric",
            matrix_path: "matrices/metric.json".into(),
            entries,
            template_name: "templates/metric.cu.j2".into(),
            template,
            name_format,
            plain: false,
            expressions: &[],
        }
    }

    #[test]
    fn plain_sources_keep_braces_and_get_defines() {
        let e = entries(json!({"dtype": ["float", "double"], "width": 4}));
        let expressions = vec!["quantize<{{ dtype }}>".to_string()];
        let src = "float zero[1] = {{0.0f}};\n";
        let r = render_all(&[FamilySource {
            plain: true,
            expressions: &expressions,
            ..fam(&e, src, "q_{{ dtype }}")
        }])
        .unwrap();
        assert_eq!(r[0].source, src, "no template engine");
        assert_eq!(r[0].defines, ["-DDTYPE=float", "-DWIDTH=4"]);
        assert_eq!(r[1].expressions, ["quantize<double>"]);
        let bad = entries(json!({"d-type": "float"}));
        let msg = render_all(&[FamilySource {
            plain: true,
            ..fam(&bad, src, "q")
        }])
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("`d-type`") && msg.contains("-D define"),
            "{msg}"
        );
    }

    #[test]
    fn renders_each_entry_with_name_and_family() {
        let e = entries(json!({"metric": ["l2", "ip"], "dtype": "f32"}));
        let r = render_all(&[fam(
            &e,
            "// {{ family }} {{ name }} {{ metric }}\n",
            "m_{{ metric }}_{{ dtype }}",
        )])
        .unwrap();
        let names: Vec<_> = r.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["m_l2_f32", "m_ip_f32"]);
        assert_eq!(r[1].source, "// metric m_ip_f32 ip\n");
    }

    #[test]
    fn missing_variable_names_template_variable_and_entry() {
        let e = entries(json!({"metric": "l2"}));
        let err = render_all(&[fam(&e, "{{ acc_type }}", "m_{{ metric }}")]).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, RenderError::MissingVariable { .. }), "{msg}");
        assert!(msg.contains("templates/metric.cu.j2"), "{msg}");
        assert!(msg.contains("`acc_type`"), "{msg}");
        assert!(msg.contains(r#"{"metric":"l2"}"#), "{msg}");
    }

    #[test]
    fn name_clash_names_both_entries() {
        let e = entries(json!({"metric": "l2", "x": ["1", "2"]}));
        let msg = render_all(&[fam(&e, "", "m_{{ metric }}")])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(r#""x":"1""#) && msg.contains(r#""x":"2""#),
            "{msg}"
        );
    }

    #[test]
    fn unsafe_name_is_an_error() {
        let e = entries(json!({"metric": "l-2"}));
        let msg = render_all(&[fam(&e, "", "m_{{ metric }}")])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`m_l-2`") && msg.contains("not an identifier"),
            "{msg}"
        );
    }

    #[test]
    fn empty_product_says_so() {
        let e = entries(json!({"metric": []}));
        let msg = render_all(&[fam(&e, "", "m")]).unwrap_err().to_string();
        assert!(
            msg.contains("empty product") && msg.contains("matrices/metric.json"),
            "{msg}"
        );
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("scan_f32_u32_v4_k64"));
        assert!(is_identifier("_x"));
        assert!(!is_identifier("4x"));
        assert!(!is_identifier(""));
        assert!(!is_identifier("a b"));
    }
}

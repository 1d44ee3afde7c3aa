//! Golden-file test of the generated registry (prost-build style): the
//! generated code is reviewed as text. `FRAGLINK_UPDATE_GOLDEN=1 cargo test
//! --test codegen_golden` rewrites the golden file after an intended change.

mod support;

use fraglink::build::codegen::{generate, FamilyDecl, FragmentDecl, Param, ParamKind};
use fraglink::build::compile::Recorded;
use fraglink::build::matrix::Entry;
use serde_json::json;

fn entry(v: serde_json::Value) -> Entry {
    serde_json::from_value(v).unwrap()
}

fn fixture() -> (Vec<FamilyDecl>, Vec<FragmentDecl>) {
    let tag = |key: &str, t: &str| Param {
        key: key.into(),
        kind: ParamKind::Tag {
            trait_name: t.into(),
        },
    };
    let families = vec![
        FamilyDecl {
            family: "metric".into(),
            type_name: "MetricFragment".into(),
            params: vec![tag("metric", "Metric"), tag("dtype", "DataType")],
        },
        FamilyDecl {
            family: "scan".into(),
            type_name: "ScanFragment".into(),
            params: vec![
                tag("dtype", "DataType"),
                Param {
                    key: "veclen".into(),
                    kind: ParamKind::Const { ty: "u32".into() },
                },
            ],
        },
        FamilyDecl {
            family: "post".into(),
            type_name: "PostFragment".into(),
            params: vec![],
        },
    ];
    let frag = |family: &str, name: &str, e: serde_json::Value, len: usize| FragmentDecl {
        family: family.into(),
        name: name.into(),
        entry: entry(e),
        archs: vec!["compute_75".into(), "sm_90".into()],
        fatbin_file: format!("fatbins/{name}.fatbin"),
        fatbin_len: len,
        hash: format!("hash-of-{name}"),
        recorded: Recorded {
            entries: vec![
                ("compute_75".into(), vec![name.to_string()]),
                (
                    "sm_90".into(),
                    vec![name.to_string(), format!("{name}_sm90_only")],
                ),
            ],
            definitions: vec![name.to_string()],
            lowered: vec![(
                format!("{name}<float>"),
                format!("_Z{}{name}IfEvv", name.len()),
            )],
            sass: vec!["sm_90".into()],
        },
    };
    let fragments = vec![
        frag(
            "metric",
            "metric_l2_f32",
            json!({"metric": "l2", "dtype": "f32", "acc": "float"}),
            100,
        ),
        frag(
            "metric",
            "metric_inner_product_f16",
            json!({"metric": "inner_product", "dtype": "f16"}),
            120,
        ),
        frag(
            "scan",
            "scan_f32_v4",
            json!({"dtype": "f32", "veclen": "4"}),
            4000,
        ),
        frag(
            "post",
            "post_identity",
            json!({"post": "identity", "flag": true}),
            64,
        ),
    ];
    (families, fragments)
}

#[test]
fn registry_matches_golden_file() {
    let (families, fragments) = fixture();
    let code = generate("::fraglink", &families, &fragments).unwrap();
    let path = support::manifest_dir().join("tests/golden/registry.rs.txt");
    if std::env::var_os("FRAGLINK_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &code).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read golden file {} (FRAGLINK_UPDATE_GOLDEN=1 writes it): {e}",
            path.display()
        )
    });
    assert_eq!(
        code,
        golden,
        "generated registry differs from {}",
        path.display()
    );
}

#[test]
fn a_bad_const_value_names_family_key_and_fragment() {
    let (families, mut fragments) = fixture();
    fragments[2].entry.insert("veclen".into(), json!("four"));
    let msg = generate("::fraglink", &families, &fragments)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("scan")
            && msg.contains("veclen")
            && msg.contains("scan_f32_v4")
            && msg.contains("four"),
        "{msg}"
    );
}

#[test]
fn a_missing_param_names_the_entry() {
    let (families, mut fragments) = fixture();
    fragments[0].entry.remove("dtype");
    let msg = generate("::fraglink", &families, &fragments)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`dtype`")
            && msg.contains("metric_l2_f32")
            && msg.contains(r#""metric":"l2""#),
        "{msg}"
    );
}

//! A fragment the matrices did not produce is a compile error, not a link
//! error at run time.

#[test]
fn missing_fragment_combinations_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.pass("tests/compile_fail/existing_ok.rs");
    t.compile_fail("tests/compile_fail/missing_*.rs");
}

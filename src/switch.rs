//! On/off environment variables, read one way everywhere (the README's
//! environment table lists them).

/// What a switch's error says it takes.
pub(crate) const SWITCH_EXPECTED: &str = "1/true/yes/on or 0/false/no/off";

/// `value` as a switch: `1`/`true`/`yes`/`on` on, `0`/`false`/`no`/`off`
/// off (any case, surrounding blanks ignored), empty `default`; `None` for
/// anything else, which the caller reports naming its variable.
pub(crate) fn parse_switch(value: &str, default: bool) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "" => Some(default),
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// The value of `var`: `None` where it is unset; one that is not Unicode
/// lossily converted, so a parser refuses it and its error shows it.
pub(crate) fn env_value(var: &str) -> Option<String> {
    env_text(var).unwrap_or_else(Some)
}

/// The value of `var` where any text is valid (a program's name):
/// `Ok(None)` where it is unset, `Err` with the value lossily converted
/// where it is not Unicode, for an error naming `var` (no parser would
/// refuse it).
pub(crate) fn env_text(var: &str) -> Result<Option<String>, String> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(v.to_string_lossy().into_owned()),
    }
}

/// The switch `var` (unset: `default`); `Err` with the value it does not
/// take.
pub(crate) fn switch_by_env(var: &str, default: bool) -> Result<bool, String> {
    match env_value(var) {
        Some(v) => parse_switch(&v, default).ok_or(v),
        None => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_either_way_empty_is_the_default_and_the_rest_is_refused() {
        for on in ["1", " On ", "TRUE", "yes"] {
            assert_eq!(parse_switch(on, false), Some(true), "{on}");
        }
        for off in ["0", "false", "No", " off"] {
            assert_eq!(parse_switch(off, true), Some(false), "{off}");
        }
        assert_eq!(parse_switch("", true), Some(true));
        assert_eq!(parse_switch("  ", false), Some(false));
        assert_eq!(parse_switch("maybe", true), None);
        assert_eq!(parse_switch("2", false), None);
    }
}

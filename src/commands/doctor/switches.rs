//! The `INFERNO_*` switches as this process sees them ([`crate::switches`]): every switch for
//! users and diagnostics, test knobs only when set (one left set by accident changes `serve`).

use super::Problem;
use super::render::Line;
use crate::switches::{Kind, State};

/// One line per switch shown: its value in effect, and whether it was set.
pub fn lines(states: &[State]) -> Vec<Line> {
    states.iter().filter(|s| s.kind != Kind::Test || s.set.is_some()).map(line).collect()
}

fn line(s: &State) -> Line {
    let test = if s.kind == Kind::Test { ", for tests" } else { "" };
    match (&s.set, &s.error) {
        (Some(v), Some(e)) => Line::bad(format!("{}={v}: {e}; using {}", s.name, s.value)),
        (Some(_), None) => Line::ok(format!("{}={} (set{test})", s.name, s.value)),
        (None, _) => Line::ok(format!("{}={} (default)", s.name, s.value)),
    }
}

/// A refused value, with the accepted ones.
pub fn problems(states: &[State]) -> Vec<Problem> {
    let refused = states.iter().filter_map(|s| Some((s, s.set.as_ref()?, s.error.as_ref()?)));
    refused
        .map(|(s, v, e)| Problem {
            what: format!("{}={v} is not accepted ({e})", s.name),
            fix: format!("set {} to {}, or unset it (default {})", s.name, s.values, s.default),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(kind: Kind, set: Option<&str>, error: Option<&str>) -> State {
        State {
            name: "INFERNO_X",
            kind,
            value: "1".into(),
            set: set.map(String::from),
            error: error.map(String::from),
            values: "0, 1",
            default: "1",
            what: "",
        }
    }

    #[test]
    fn lines_say_set_or_default_and_refused_values_are_problems() {
        let states = [
            state(Kind::User, None, None),
            state(Kind::Diagnostic, Some("1"), None),
            state(Kind::User, Some("maybe"), Some("expected 0 or 1")),
            state(Kind::Test, None, None),
            state(Kind::Test, Some("1"), None),
        ];
        let text: Vec<(bool, String)> =
            lines(&states).into_iter().map(|l| (l.ok, l.text)).collect();
        assert_eq!(
            text,
            [
                (true, "INFERNO_X=1 (default)".to_string()),
                (true, "INFERNO_X=1 (set)".to_string()),
                (false, "INFERNO_X=maybe: expected 0 or 1; using 1".to_string()),
                (true, "INFERNO_X=1 (set, for tests)".to_string()),
            ]
        );
        let problems = problems(&states);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].what, "INFERNO_X=maybe is not accepted (expected 0 or 1)");
        assert_eq!(problems[0].fix, "set INFERNO_X to 0, 1, or unset it (default 1)");
    }
}

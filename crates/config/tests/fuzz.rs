//! Whatever bytes a config file holds, loading it returns a config or located errors: never a panic.

use proptest::prelude::*;

const VALID: &str = include_str!("../../../config/duet.yaml");

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        let _ = duet_config::parse(&text, "fuzz.yaml");
    }

    /// Mutations of the real example: cut a span, or splice arbitrary text into it.
    #[test]
    fn mutated_example_never_panics_and_errors_point_inside_the_file(
        at in 0usize..VALID.len(),
        cut in 0usize..40,
        splice in "[ -~\n:{}\\[\\],*&!|>-]{0,20}",
    ) {
        let mut text = VALID.to_owned();
        let at = (0..=at).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        let end = (at + cut).min(text.len());
        let end = (end..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
        text.replace_range(at..end, &splice);
        if let Err(errors) = duet_config::parse(&text, "fuzz.yaml") {
            let lines = text.lines().count() as u64 + 1;
            for error in &errors.errors {
                prop_assert!(error.line <= lines, "line {} of {}: {}", error.line, lines, error);
                prop_assert!(!error.message.is_empty());
            }
        }
    }
}

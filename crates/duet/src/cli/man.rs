//! `duet man`: the manual pages. duet(1) and one page per command come from the clap definition
//! (`args.rs`), duet.yaml(5) from the book's configuration reference, so neither can say other than
//! `--help` and the reference do.

use std::io::Write;
use std::path::Path;

/// The configuration reference, whose tables `tests/docs.rs` keeps complete against the schema.
const REFERENCE: &str = include_str!("../../../../docs/src/reference/configuration.md");

/// Prints duet(1) to stdout, or with `out` writes every page into that folder and names them.
pub(super) fn run(command: clap::Command, out: Option<&Path>) -> i32 {
    let result = match out {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .and_then(|()| std::io::stdout().write_all(&page))
        }
        Some(dir) => write_pages(command, dir),
    };
    match result {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("duet man: {error}");
            1
        }
    }
}

fn write_pages(command: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(command, dir)?;
    std::fs::write(
        dir.join("duet.yaml.5"),
        configuration_page(env!("CARGO_PKG_VERSION")),
    )?;
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("duet") && (name.ends_with(".1") || name.ends_with(".5"))
        })
        .collect();
    names.sort();
    for name in names {
        println!("{}", name.display());
    }
    Ok(())
}

/// duet.yaml(5) in roff, from the reference's Markdown: headings become sections, each table row a
/// tagged paragraph (key; type, default, reload; what), the example a literal block.
pub(crate) fn configuration_page(version: &str) -> String {
    let mut page = format!(
        ".TH duet.yaml 5 \"\" \"duet {version}\"\n.SH NAME\nduet.yaml \\- the configuration file of duet(1)\n"
    );
    let mut in_code = false;
    let mut paragraph_open = false;
    for line in REFERENCE.lines() {
        if line.starts_with("```") {
            page.push_str(if in_code { ".fi\n" } else { ".PP\n.nf\n" });
            in_code = !in_code;
            paragraph_open = false;
        } else if in_code {
            page.push_str(&escape(line));
            page.push('\n');
        } else if let Some(heading) = line.strip_prefix("## ") {
            page.push_str(&format!(".SH {}\n", escape(&plain(heading)).to_uppercase()));
            paragraph_open = false;
        } else if line.starts_with("# ") || line.starts_with("|---") || line.starts_with("| key |")
        {
            // The title is the page's NAME; a table's head is the same for every row.
        } else if let Some(row) = line.strip_prefix("| ") {
            let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").collect();
            if let [key, kind, default, reload, what] = cells.as_slice() {
                page.push_str(&format!(
                    ".TP\n.B {}\n{}; default: {}; reload: {}. {}\n",
                    escape(&plain(key)),
                    escape(&plain(kind)),
                    escape(&plain(default)),
                    escape(&plain(reload)),
                    escape(&plain(what)),
                ));
            }
            paragraph_open = false;
        } else if line.trim().is_empty() {
            paragraph_open = false;
        } else {
            if !paragraph_open {
                page.push_str(".PP\n");
                paragraph_open = true;
            }
            page.push_str(&escape(&plain(line)));
            page.push('\n');
        }
    }
    page.push_str(".SH SEE ALSO\nduet(1), duet-run(1), duet-check(1)\n");
    page
}

/// Markdown's markup dropped: code spans, emphasis, and links (their text kept).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text.trim();
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']').map(|i| open + i) else {
            break;
        };
        let target_end = rest[close..]
            .strip_prefix("](")
            .and_then(|target| target.find(')'))
            .map(|i| close + 2 + i);
        match target_end {
            // `[text](target)`: the text alone.
            Some(end) => {
                out.push_str(&rest[..open]);
                out.push_str(&rest[open + 1..close]);
                rest = &rest[end + 1..];
            }
            // Brackets that are no link (`[10.0.0.0/8]`): kept.
            None => {
                out.push_str(&rest[..=close]);
                rest = &rest[close + 1..];
            }
        }
    }
    out.push_str(rest);
    out.replace('`', "").replace("**", "").replace('*', "")
}

/// Text safe in roff: backslashes escaped, and a line never opening with a control character.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_page_has_every_key() {
        let page = configuration_page("0.0.0");
        assert!(page.starts_with(".TH duet.yaml 5"), "{page}");
        for key in duet_config::schema_keys() {
            assert!(
                page.contains(&format!(".B {key}\n")),
                "duet.yaml(5) has no entry for {key}"
            );
        }
    }

    #[test]
    fn markdown_becomes_plain_text() {
        assert_eq!(
            plain("see [limits](../limits.md#units) and `a.b`, **bold**"),
            "see limits and a.b, bold"
        );
        assert_eq!(plain("`[10.0.0.0/8]` [a](b)"), "[10.0.0.0/8] a");
        assert_eq!(escape(".hidden"), "\\&.hidden");
        assert_eq!(escape("a\\b"), "a\\eb");
    }
}

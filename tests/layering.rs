//! The shape of the code, held by tests: inside each crate a module imports only modules below it, and
//! no function runs past a screen.
//!
//! "Below" is the order of the `mod` declarations: in `lib.rs` (or `main.rs`) and in each folder's
//! `mod.rs`, modules are declared top layer first, and a module may use (`use crate::…`, `super::…`,
//! or a `crate::…` path in code) only modules declared after it at the level where the two paths part,
//! or its own children. `rustfmt.toml` keeps rustfmt from sorting those declarations.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

/// A module of a crate: its path from the crate root, its file, its children in declared order, and
/// what it re-exports (`pub use a::b::C` makes `C` stand for `a::b::C`, relative to the module).
struct Module {
    path: Vec<String>,
    file: PathBuf,
    children: Vec<String>,
    reexports: HashMap<String, Vec<String>>,
}

/// Every module of the crate whose root file is `root`, keyed by path (the root is `[]`).
fn modules(root: &Path) -> HashMap<Vec<String>, Module> {
    let mut found = HashMap::new();
    let mut pending = vec![(Vec::new(), root.to_path_buf())];
    while let Some((path, file)) = pending.pop() {
        let source = std::fs::read_to_string(&file).expect("a readable source file");
        let children = declared_modules(&source);
        // `foo.rs`'s children live in `foo/`, `mod.rs`'s and the root's beside it.
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let dir = match (path.is_empty(), stem) {
            (true, _) | (false, "mod") => file.parent().expect("a folder").to_path_buf(),
            _ => file.with_extension(""),
        };
        for child in &children {
            let flat = dir.join(format!("{child}.rs"));
            let file = if flat.exists() {
                flat
            } else {
                dir.join(child).join("mod.rs")
            };
            let mut child_path = path.clone();
            child_path.push(child.clone());
            pending.push((child_path, file));
        }
        let reexports = reexports(&code_of(&source));
        found.insert(
            path.clone(),
            Module {
                path,
                file,
                children,
                reexports,
            },
        );
    }
    found
}

/// What `pub use` lines re-export: each name, and the path (from the module) it stands for.
fn reexports(code: &str) -> HashMap<String, Vec<String>> {
    let mut found = HashMap::new();
    for (at, _) in code.match_indices("pub use ") {
        let (paths, _) = use_tree(&code[at + "pub use ".len()..]);
        for path in paths {
            if let Some(name) = path.last() {
                found.insert(name.clone(), path.clone());
            }
        }
    }
    found
}

/// The path an import really names: a name an ancestor re-exports is followed to where it comes from.
fn followed(modules: &HashMap<Vec<String>, Module>, import: &[String]) -> Vec<String> {
    let mut import = import.to_vec();
    for _ in 0..8 {
        let (module, name) = match import.split_last() {
            Some((name, module)) => (module.to_vec(), name.clone()),
            None => break,
        };
        let Some(path) = modules.get(&module).and_then(|m| m.reexports.get(&name)) else {
            break;
        };
        let path = match path.first().map(String::as_str) {
            Some("crate") => path[1..].to_vec(),
            Some("self") => module.iter().chain(&path[1..]).cloned().collect(),
            _ => module.iter().chain(path).cloned().collect(),
        };
        import = path;
    }
    import
}

/// The `mod name;` declarations of a file, in order, leaving out `#[cfg(test)]` ones and inline
/// modules (`mod name { … }`).
fn declared_modules(source: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut test_only = false;
    for line in source.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            test_only = true;
            continue;
        }
        let declaration = ["pub(crate) mod ", "pub(super) mod ", "pub mod ", "mod "]
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix))
            .and_then(|rest| rest.strip_suffix(';'));
        if let (Some(name), false) = (declaration, test_only) {
            names.push(name.trim().to_owned());
        }
        if !line.starts_with("#[") {
            test_only = false;
        }
    }
    names
}

/// The source without comments, string literals and `#[cfg(test)] mod … { … }` blocks.
fn code_of(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut code = String::with_capacity(source.len());
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        if line.trim().starts_with("#[cfg(test)]")
            && lines.get(at + 1).is_some_and(|next| next.contains("mod "))
        {
            at = item_end(&lines, at + 1).map_or(lines.len(), |(end, _)| end + 1);
            continue;
        }
        let line = line.split("//").next().unwrap_or("");
        let mut in_string = false;
        let mut escaped = false;
        for c in line.chars() {
            match (in_string, escaped, c) {
                (true, false, '\\') => escaped = true,
                (true, false, '"') => in_string = false,
                (true, _, _) => escaped = false,
                (false, _, '"') => in_string = true,
                (false, _, c) => code.push(c),
            }
        }
        code.push('\n');
        at += 1;
    }
    code
}

/// Where the item that starts at `lines[start]` ends: its last line, and whether it had a braced body
/// (a declaration such as `mod x;` or `fn f();` has none).
fn item_end(lines: &[&str], start: usize) -> Option<(usize, bool)> {
    let mut depth = 0i64;
    let mut opened = false;
    for (at, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if !opened && line.trim_end().ends_with(';') {
            return Some((at, false));
        }
        if opened && depth <= 0 {
            return Some((at, true));
        }
    }
    None
}

/// Every path a module names from its crate: `use crate::{a::{b, c}, d}` gives `a::b`, `a::c`, `d`;
/// `crate::x::y` in code gives `x::y`; `super::z` is resolved against `module`. A `pub use` line is
/// left to [`reexports`].
fn imports(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (anchor, base) in [
        ("crate::", Vec::new()),
        ("super::", module[..module.len().saturating_sub(1)].to_vec()),
    ] {
        let mut rest = code;
        while let Some(at) = rest.find(anchor) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + anchor.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let (tree, _) = use_tree(rest);
            for path in tree {
                let mut full = base.clone();
                full.extend(path);
                paths.push(full);
            }
        }
    }
    paths
}

/// Parses a use tree (`a::b`, `a::{b, c::d}`, `a as b`, `*`) at the start of `text` into its paths.
fn use_tree(text: &str) -> (Vec<Vec<String>>, &str) {
    let text = text.trim_start();
    if let Some(mut rest) = text.strip_prefix('{') {
        let mut paths = Vec::new();
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('}') {
                return (paths, after);
            }
            let (more, after) = use_tree(rest);
            paths.extend(more);
            rest = after.trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest);
            if rest.is_empty() {
                return (paths, rest);
            }
        }
    }
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    let (name, rest) = text.split_at(end);
    if name.is_empty() {
        // `*`, or something this reader does not follow: it names no module.
        return (vec![Vec::new()], rest.get(1..).unwrap_or(""));
    }
    match rest.strip_prefix("::") {
        Some(after) => {
            let (subpaths, after) = use_tree(after);
            let paths = subpaths
                .into_iter()
                .map(|mut path| {
                    path.insert(0, name.to_owned());
                    path
                })
                .collect();
            (paths, after)
        }
        None => (vec![vec![name.to_owned()]], rest),
    }
}

/// The upward imports of the crate whose root file is `root`, one line each.
fn upward_imports(root: &Path) -> Vec<String> {
    let modules = modules(root);
    let mut found = Vec::new();
    for module in modules.values() {
        let source = std::fs::read_to_string(&module.file).expect("a readable source file");
        for import in imports(&code_of(&source), &module.path) {
            let import = followed(&modules, &import);
            // The longest prefix of the import that names a module.
            let mut target: &[String] = &[];
            for end in 1..=import.len() {
                if modules.contains_key(&import[..end]) {
                    target = &import[..end];
                }
            }
            if let Some(why) = upward(&modules, &module.path, target) {
                found.push(format!(
                    "{}: imports crate::{} ({why})",
                    module.file.display(),
                    import.join("::")
                ));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Why `from` may not import `to`, if it may not.
fn upward(
    modules: &HashMap<Vec<String>, Module>,
    from: &[String],
    to: &[String],
) -> Option<String> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() {
        return None; // itself or its own children
    }
    if common == to.len() {
        // An item an ancestor defines itself (re-exports were followed to their source): the crate's
        // own vocabulary, which its children build on.
        return None;
    }
    let parent = &modules[&from[..common]];
    let position = |name: &String| parent.children.iter().position(|c| c == name);
    let (mine, theirs) = (position(&from[common]), position(&to[common]));
    (mine >= theirs).then(|| {
        format!(
            "`{}` is declared above `{}` in {}",
            to[common],
            from[common],
            parent.file.display()
        )
    })
}

/// The crates' root files: `lib.rs`, or `main.rs` for a crate without one.
fn crate_roots() -> Vec<PathBuf> {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let mut roots: Vec<PathBuf> = std::fs::read_dir(crates)
        .expect("crates/")
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let src = entry.path().join("src");
            ["lib.rs", "main.rs"]
                .iter()
                .map(|root| src.join(root))
                .find(|root| root.exists())
        })
        .collect();
    roots.sort();
    roots
}

#[test]
fn every_crate_imports_only_downward() {
    let roots = crate_roots();
    assert!(roots.len() >= 6, "found the crates: {roots:?}");
    let found: Vec<String> = roots.iter().flat_map(|root| upward_imports(root)).collect();
    assert!(
        found.is_empty(),
        "modules importing from above them (reorder the `mod` lines, or move the item down):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_layering_check_catches_an_upward_import() {
    let dir = std::env::temp_dir().join(format!("duet-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("stage")).expect("temp dir");
    let write = |file: &str, text: &str| std::fs::write(dir.join(file), text).expect("write");
    write(
        "lib.rs",
        "mod handler;\nmod stage;\nmod leaf;\npub use handler::Handler;\npub struct Vocabulary;\n",
    );
    write(
        "handler.rs",
        "use crate::{stage::route::Routed, leaf::X};\n",
    );
    write(
        "stage/mod.rs",
        "pub(crate) mod route;\npub(crate) mod respond;\n",
    );
    write("stage/respond.rs", "use crate::{leaf::X, Vocabulary};\n");
    write(
        "leaf.rs",
        "pub struct X;\n#[cfg(test)]\nmod tests {\n    use crate::handler::Y;\n}\n",
    );
    write("stage/route.rs", "fn f() { super::respond::g(); }\n");
    assert_eq!(upward_imports(&dir.join("lib.rs")), Vec::<String>::new());

    // A stage reaching up to the handler, and a stage reaching up to a sibling declared above it.
    write(
        "stage/respond.rs",
        "use crate::leaf::X;\nfn f() { crate::handler::h(); super::route::r(); }\n",
    );
    let found = upward_imports(&dir.join("lib.rs"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].contains("imports crate::handler::h (`handler` is declared above `stage`"));
    assert!(
        found[1].contains("imports crate::stage::route::r (`route` is declared above `respond`")
    );
}

/// Functions in `crates/*/src` longer than `limit` lines, test modules aside: `file:line name (n)`.
fn long_functions(limit: usize) -> Vec<String> {
    let mut found = Vec::new();
    for root in crate_roots() {
        for module in modules(&root).values() {
            let source = std::fs::read_to_string(&module.file).expect("a readable source file");
            found.extend(
                functions(&code_of(&source))
                    .into_iter()
                    .filter(|(_, _, lines)| *lines > limit)
                    .map(|(line, name, lines)| {
                        format!("{}:{line} {name} ({lines} lines)", module.file.display())
                    }),
            );
        }
    }
    found.sort();
    found
}

/// Each function of `code`: its first line (1-based), name and length in lines.
fn functions(code: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ") else { continue };
        let before = line[..at].trim();
        let signature_start = before.is_empty()
            || before.split_whitespace().all(|word| {
                [
                    "pub",
                    "pub(crate)",
                    "pub(super)",
                    "async",
                    "const",
                    "unsafe",
                ]
                .contains(&word)
            });
        if !signature_start {
            continue;
        }
        let name: String = line[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if let Some((end, true)) = item_end(&lines, start) {
            found.push((start + 1, name, end - start + 1));
        }
    }
    found
}

#[test]
fn no_function_runs_past_80_lines() {
    let found = long_functions(80);
    assert!(
        found.is_empty(),
        "functions longer than 80 lines (split them by concern):\n{}",
        found.join("\n")
    );
}

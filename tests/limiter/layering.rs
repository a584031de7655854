//! The layering in `docs/architecture.md` is checked, not only described: every module of the
//! crate and of the gateway is in its table, and no `crate::…` path in a module names one that
//! stands above it there (a lower level number). Modules of one level may use each other; doc
//! comments may link anywhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The level of each module in the table under the `## ` heading that names `crate_name`.
fn levels(doc: &str, crate_name: &str) -> BTreeMap<String, f64> {
    let mut in_section = false;
    let mut in_table = false;
    let mut out = BTreeMap::new();
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            in_section = heading.contains(&format!("`{crate_name}`"));
            in_table = false;
            continue;
        }
        if !in_section {
            continue;
        }
        if line.starts_with("| level | modules |") {
            in_table = true;
            continue;
        }
        if in_table && !line.starts_with('|') {
            break;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let level: f64 = cells[1]
            .replace('½', ".5")
            .parse()
            .unwrap_or_else(|_| panic!("a level number: {line}"));
        for module in top_level_names(cells[2]) {
            out.insert(module, level);
        }
    }
    assert!(!out.is_empty(), "no layering table for {crate_name}");
    out
}

/// The backticked names of a cell outside parentheses: `lib` (`app`: …), `main` → lib, main.
fn top_level_names(cell: &str) -> Vec<String> {
    let mut depth = 0;
    let mut outside = String::new();
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to.
fn sources(src: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(src).unwrap();
                let first = relative.components().next().unwrap();
                let name = first.as_os_str().to_str().unwrap();
                out.push((name.trim_end_matches(".rs").to_owned(), path.clone()));
            }
        }
    }
    out
}

/// The top-level modules `text` names through `crate::`: `crate::a::…`, `crate::{a, b::c}`.
fn named_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        // Not `some_crate::` or `$crate::`.
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start => {
                        out.push(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest));
        }
    }
    out
}

/// Every import of `src` that runs up `levels`, and every module missing from it.
fn violations(src: &Path, levels: &BTreeMap<String, f64>, roots: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (module, path) in sources(src) {
        if roots.contains(&module.as_str()) {
            continue;
        }
        let Some(&own) = levels.get(&module) else {
            found.push(format!(
                "{}: module `{module}` is not in the table",
                path.display()
            ));
            continue;
        };
        // Code only: a doc link to a module above is a reference for the reader, not a use.
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for used in named_modules(&text) {
            if used == module || used.is_empty() {
                continue;
            }
            match levels.get(&used) {
                Some(&level) if level < own => found.push(format!(
                    "{}: `{module}` (level {own}) uses `{used}` (level {level}), above it",
                    path.display()
                )),
                Some(_) => {}
                None if roots.contains(&used.as_str()) => found.push(format!(
                    "{}: `{module}` uses the crate root's `{used}`",
                    path.display()
                )),
                None => {}
            }
        }
    }
    found
}

#[test]
fn every_module_imports_only_downward_as_the_architecture_says() {
    let root = root();
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut found = Vec::new();
    for (crate_name, dir, roots) in [
        (
            "tower-priority-limit",
            "tower-priority-limit/src",
            &["lib"][..],
        ),
        (
            "gateway-example",
            "gateway-example/src",
            &["lib", "main", "bin"][..],
        ),
        // Its `tests` and `differential` modules are test-only, over the whole crate.
        (
            "upstream-client",
            "upstream-client/src",
            &["lib", "tests", "differential"][..],
        ),
    ] {
        let levels = levels(&doc, crate_name);
        found.extend(violations(&root.join(dir), &levels, roots));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The checker itself: it reads a table, `crate::` paths in their forms, and finds an import that
/// runs up (so the test above can fail).
#[test]
fn the_checker_finds_an_import_that_runs_up() {
    let doc = "## The crate: `x`\n\n| level | modules | what |\n|---|---|---|\n| 1 | `top` (`inner`: no), `also` | a |\n| 2½ | `low` | b |\n";
    let levels = levels(doc, "x");
    assert_eq!(
        levels.into_iter().collect::<Vec<_>>(),
        [
            ("also".to_owned(), 1.0),
            ("low".to_owned(), 2.5),
            ("top".to_owned(), 1.0)
        ]
    );
    assert_eq!(
        named_modules("use crate::a::B; use crate::{b::C, c, d::{e, f}}; my_crate::z; $crate::y; x(crate::g::h)"),
        ["a", "b", "c", "d", "g"]
    );
    let dir = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("low")).unwrap();
    std::fs::write(dir.join("top.rs"), "use crate::low::X;").unwrap();
    std::fs::write(dir.join("low/mod.rs"), "use crate::top::Y;").unwrap();
    std::fs::write(dir.join("stray.rs"), "").unwrap();
    let levels: BTreeMap<String, f64> = [("top".to_owned(), 1.0), ("low".to_owned(), 2.0)]
        .into_iter()
        .collect();
    let mut found = violations(&dir, &levels, &["lib"]);
    found.sort();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("`low` (level 2) uses `top` (level 1)"),
        "{found:?}"
    );
    assert!(
        found[1].contains("module `stray` is not in the table"),
        "{found:?}"
    );
}

//! Checks `docs/CONFIGURATION.md` against the code: each struct's section lists every field its `Debug`
//! output has, in order, with the default value exactly as `Debug` prints it, so the document cannot
//! drift from the configuration it describes.

/// The top-level fields of a struct's `Debug` output (`Name { a: 1, b: Some(2s) }`), as (name, value).
///
/// # Errors
/// When `debug` is not a struct's `Debug` output.
pub fn debug_fields(debug: &str) -> Result<Vec<(String, String)>, String> {
    let open = debug
        .find('{')
        .ok_or_else(|| format!("not a struct: {debug}"))?;
    let body = debug[open + 1..]
        .trim_end()
        .strip_suffix('}')
        .ok_or_else(|| format!("not a struct: {debug}"))?;
    split_top_level(body)
        .into_iter()
        .filter(|part| !part.trim().is_empty())
        .map(|part| {
            let (name, value) = part
                .split_once(": ")
                .ok_or_else(|| format!("not a field: {part}"))?;
            Ok((name.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

/// Splits at the commas outside brackets and string literals.
fn split_top_level(body: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut quoted, mut escaped, mut start) =
        (Vec::new(), 0i32, false, false, 0);
    for (i, c) in body.char_indices() {
        if quoted {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
}

/// The rows of the table under the heading ``## `name` `` in `doc`, as (field, default) with backticks
/// removed; a default written `see ...` (a nested type, checked in its own section) or `required` (a
/// constructor's argument) comes back as `None`.
///
/// # Errors
/// When the section or its table is missing.
pub fn doc_rows(doc: &str, name: &str) -> Result<Vec<(String, Option<String>)>, String> {
    let heading = format!("## `{name}`");
    let start = doc
        .lines()
        .position(|l| l.trim() == heading)
        .ok_or_else(|| format!("docs/CONFIGURATION.md has no section {heading}"))?;
    let rows: Vec<(String, Option<String>)> = doc
        .lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let field = cells
                .get(1)
                .copied()
                .unwrap_or("")
                .trim_matches('`')
                .to_string();
            let default = cells.get(2).copied().unwrap_or("");
            let unchecked = default.starts_with("see ") || default.trim_matches('`') == "required";
            let value = (!unchecked).then(|| {
                let v = default.strip_prefix('`').unwrap_or(default);
                v.strip_suffix('`').unwrap_or(v).to_string()
            });
            (field, value)
        })
        .collect();
    if rows.is_empty() {
        return Err(format!("section {heading} has no table of fields"));
    }
    Ok(rows)
}

/// Compares the section of `name` with `debug`, the `Debug` output of the struct's default.
///
/// # Errors
/// Every difference, one per line.
pub fn check(doc: &str, name: &str, debug: &str) -> Result<(), String> {
    let code = debug_fields(debug)?;
    let rows = doc_rows(doc, name)?;
    let mut problems = Vec::new();
    let code_names: Vec<&str> = code.iter().map(|(n, _)| n.as_str()).collect();
    let doc_names: Vec<&str> = rows.iter().map(|(n, _)| n.as_str()).collect();
    if code_names != doc_names {
        problems.push(format!(
            "{name}: the code's fields are {code_names:?}, the document lists {doc_names:?}"
        ));
    }
    for (field, value) in &code {
        let documented = rows
            .iter()
            .find(|(f, _)| f == field)
            .and_then(|(_, v)| v.as_ref());
        if let Some(doc_value) = documented
            && doc_value != value
        {
            problems.push(format!(
                "{name}.{field}: the default is `{value}`, the document says `{doc_value}`"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_split_outside_brackets_and_strings_and_checked_against_the_table() {
        let debug =
            r#"Demo { a: 1, b: Some(2s), c: Inner { x: [1, 2], y: "p, q" }, d: "say \"hi\", ok" }"#;
        let fields = debug_fields(debug).unwrap();
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        assert_eq!(fields[2].1, r#"Inner { x: [1, 2], y: "p, q" }"#);
        let doc = "## `Demo`\n\n| field | default | unit | meaning |\n| --- | --- | --- | --- |\n\
                   | `a` | `1` | count | a |\n| `b` | `Some(2s)` | duration | b |\n\
                   | `c` | see `Inner` | - | c |\n| `d` | `\"say \\\"hi\\\", ok\"` | - | d |\n\n## `Next`\n";
        check(doc, "Demo", debug).unwrap();
        let wrong = doc.replace("`Some(2s)`", "`Some(3s)`");
        let why = check(&wrong, "Demo", debug).unwrap_err();
        assert!(why.contains("Demo.b: the default is `Some(2s)`"), "{why}");
        let missing = doc.replace("| `d` |", "| `e` |");
        assert!(
            check(&missing, "Demo", debug)
                .unwrap_err()
                .contains("the code's fields are")
        );
        assert!(check(doc, "Absent", debug).is_err());
    }
}

//! docs/schema.md as blocks and prose. A generated block sits between
//! `<!-- generated: NAME -->` and `<!-- end -->`: a table with one row per
//! column (or function) whose last cell, the meaning, is hand-written and
//! kept when the block is rewritten, then one line per constraint, index,
//! trigger and table-wide fact. Everything else in the file is prose.

use std::collections::{BTreeMap, HashMap};

use super::catalog::Fact;

pub(crate) const BEGIN: &str = "<!-- generated: ";
pub(crate) const END: &str = "<!-- end -->";

/// What one block must say, from the catalog.
#[derive(Debug)]
pub(crate) struct Generated {
    /// The block's name: `schema.table`, or `functions in schema`.
    pub name: String,
    /// The heading its section gets when the writer adds it.
    pub heading: String,
    /// The table's header cells, the meaning last.
    pub header: &'static [&'static str],
    /// One row per column or function: its name and its cells.
    pub rows: Vec<(String, Vec<String>)>,
    pub facts: Vec<Fact>,
}

/// A block as the document has it.
#[derive(Debug)]
pub(crate) struct Block {
    pub name: String,
    /// From the start marker to the end of the end marker.
    pub range: std::ops::Range<usize>,
    pub rows: Vec<(String, Vec<String>)>,
    /// The meaning cell of each row, by the row's name.
    pub meanings: HashMap<String, String>,
    pub facts: Vec<Fact>,
}

impl Generated {
    /// The block's text, with the meanings the document gave its rows.
    pub(crate) fn render(&self, meanings: &HashMap<String, String>) -> String {
        let mut out = format!("{BEGIN}{} -->\n| {} |\n|", self.name, self.header.join(" | "));
        out.push_str(&"---|".repeat(self.header.len()));
        out.push('\n');
        for (name, cells) in &self.rows {
            let meaning = meanings.get(name).map_or("", String::as_str);
            out.push_str(&format!("| `{name}` |"));
            for cell in cells.iter().map(String::as_str).chain([meaning]) {
                match cell {
                    "" => out.push_str(" |"),
                    cell => out.push_str(&format!(" {} |", cell.replace('|', "\\|"))),
                }
            }
            out.push('\n');
        }
        if !self.facts.is_empty() {
            out.push('\n');
        }
        for f in &self.facts {
            out.push_str(&format!("- {}: `{}`\n", label(f), f.def));
        }
        out.push_str(END);
        out
    }
}

/// `constraint `name`` for a named fact, `partitioned by` for a table-wide one.
fn label(f: &Fact) -> String {
    if f.name.is_empty() {
        f.kind.clone()
    } else {
        format!("{} `{}`", f.kind, f.name)
    }
}

/// Every generated block of `doc`, in order.
pub(crate) fn blocks(doc: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(start) = doc[at..].find(BEGIN).map(|i| i + at) {
        let name_end = doc[start..]
            .find(" -->")
            .expect("a generated block's start marker ends")
            + start;
        let end = doc[name_end..]
            .find(END)
            .expect("every generated block has its end marker")
            + name_end;
        let mut block = parse(&doc[name_end + 4..end]);
        block.name = doc[start + BEGIN.len()..name_end].to_string();
        block.range = start..end + END.len();
        out.push(block);
        at = end + END.len();
    }
    out
}

fn parse(body: &str) -> Block {
    let mut block = Block {
        name: String::new(),
        range: 0..0,
        rows: Vec::new(),
        meanings: HashMap::new(),
        facts: Vec::new(),
    };
    for line in body.lines() {
        if line.starts_with("| `") {
            let mut cells = split_cells(line);
            let meaning = cells.pop().unwrap_or_default();
            let name = cells.remove(0).trim_matches('`').to_string();
            block.meanings.insert(name.clone(), meaning);
            block.rows.push((name, cells));
        } else if let Some(item) = line.strip_prefix("- ") {
            block.facts.push(parse_fact(item));
        }
    }
    block
}

/// `kind `name`: `def`` or `kind: `def``.
fn parse_fact(item: &str) -> Fact {
    let (head, def) = item.split_once(": ").unwrap_or((item, ""));
    let (kind, name) = head.split_once(" `").unwrap_or((head, ""));
    Fact {
        kind: kind.to_string(),
        name: name.trim_end_matches('`').to_string(),
        def: def.trim_matches('`').to_string(),
    }
}

/// The cells of a Markdown table row, `\|` read as `|`.
fn split_cells(line: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    let mut chars = line.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => cells.last_mut().unwrap().push(chars.next().unwrap()),
            '|' => cells.push(String::new()),
            c => cells.last_mut().unwrap().push(c),
        }
    }
    // The empty cells before the first and after the last bar.
    cells.remove(0);
    cells.pop();
    cells.iter().map(|c| c.trim().to_string()).collect()
}

/// The document with every block as the catalog renders it (meanings
/// kept), blocks of what the database lacks removed, and each block the
/// document lacks put at the end of its section (a new section at the end
/// of the file when there is none).
pub(crate) fn rewrite(doc: &str, generated: &[Generated]) -> String {
    let by_name: HashMap<&str, &Generated> = generated.iter().map(|g| (g.name.as_str(), g)).collect();
    let found = blocks(doc);
    let mut out = String::new();
    let mut at = 0;
    for block in &found {
        out.push_str(&doc[at..block.range.start]);
        at = block.range.end;
        match by_name.get(block.name.as_str()) {
            Some(g) => out.push_str(&g.render(&block.meanings)),
            // Its line goes with it.
            None => at += usize::from(doc[at..].starts_with('\n')),
        }
    }
    out.push_str(&doc[at..]);
    for g in generated.iter().filter(|g| !found.iter().any(|b| b.name == g.name)) {
        let block = g.render(&HashMap::new());
        match out.find(&format!("\n{}\n", g.heading)) {
            Some(start) => {
                let body = start + g.heading.len() + 2;
                let next = out[body..].find("\n## ").map_or(out.len(), |i| body + i);
                let end = out[..next].trim_end().len();
                out.replace_range(end..next, &format!("\n\n{block}\n"));
            }
            None => out.push_str(&format!("\n{}\n\n{block}\n", g.heading)),
        }
    }
    out
}

/// Every way `doc` differs from the catalog, each named.
pub(crate) fn problems(doc: &str, generated: &[Generated]) -> Vec<String> {
    let found = blocks(doc);
    let mut problems = Vec::new();
    for g in generated {
        match found.iter().find(|b| b.name == g.name) {
            None => problems.push(format!("docs/schema.md has no generated block for {}", g.name)),
            Some(b) => problems.extend(block_problems(doc, b, g)),
        }
    }
    for b in found.iter().filter(|b| !generated.iter().any(|g| g.name == b.name)) {
        problems.push(format!(
            "docs/schema.md documents {}, which the database does not have",
            b.name
        ));
    }
    problems
}

/// What one block lacks, has too many of, or says otherwise than the catalog.
fn block_problems(doc: &str, b: &Block, g: &Generated) -> Vec<String> {
    let keyed = |rows: &[(String, Vec<String>)], facts: &[Fact], kind: &str| {
        let rows = rows.iter().map(|(n, c)| ((kind.to_string(), n.clone()), c.join(" | ")));
        let facts = facts.iter().map(|f| ((f.kind.clone(), f.name.clone()), f.def.clone()));
        rows.chain(facts).collect::<BTreeMap<(String, String), String>>()
    };
    let want = keyed(&g.rows, &g.facts, g.header[0]);
    let have = keyed(&b.rows, &b.facts, g.header[0]);
    let name = |kind: &str, n: &str, def: &str| {
        if n.is_empty() {
            format!("{kind} `{def}`")
        } else {
            format!("{kind} `{n}`")
        }
    };
    let mut out = Vec::new();
    for ((kind, n), def) in &want {
        match have.get(&(kind.clone(), n.clone())) {
            None => out.push(format!("docs/schema.md: {} lacks {}", g.name, name(kind, n, def))),
            Some(said) if said != def => out.push(format!(
                "docs/schema.md: {} {} reads \"{said}\"; the database has \"{def}\"",
                g.name,
                name(kind, n, "")
            )),
            Some(_) => {}
        }
    }
    for ((kind, n), def) in have.iter().filter(|(k, _)| !want.contains_key(k)) {
        out.push(format!(
            "docs/schema.md lists {} of {} that the database does not have",
            name(kind, n, def),
            g.name
        ));
    }
    let rendered = g.render(&b.meanings);
    if out.is_empty() && doc[b.range.clone()] != rendered {
        let (said, is) = doc[b.range.clone()]
            .lines()
            .zip(rendered.lines())
            .find(|(d, r)| d != r)
            .unwrap_or(("(a line too many or too few)", ""));
        out.push(format!(
            "docs/schema.md: the block of {} is not laid out as generated: it reads \"{said}\" where the generator writes \"{is}\"",
            g.name
        ));
    }
    out
}

/// The tables whose section (`## schema.table`) is missing or has no prose
/// besides its generated block.
pub(crate) fn sections_without_prose(doc: &str, tables: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for table in tables {
        let heading = format!("\n## {table}\n");
        let Some(start) = doc.find(&heading) else {
            out.push(format!("docs/schema.md has no section `## {table}`"));
            continue;
        };
        let body = &doc[start + heading.len()..];
        let body = &body[..body.find("\n## ").unwrap_or(body.len())];
        let prose = prose_of(body);
        if prose.iter().all(|p| p.trim().is_empty()) {
            out.push(format!("docs/schema.md: {table} has no prose saying what it is for"));
        }
    }
    out
}

/// The hand-written parts of `text`: its paragraphs outside generated
/// blocks, and the meaning cells inside them.
pub(crate) fn prose_of(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    for b in blocks(text) {
        out.extend(text[at..b.range.start].split("\n\n").map(str::to_string));
        out.extend(b.meanings.into_values());
        at = b.range.end;
    }
    out.extend(text[at..].split("\n\n").map(str::to_string));
    out
}

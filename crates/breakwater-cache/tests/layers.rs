//! The source files' layering: no two files of a crate depend on each
//! other, directly or around a loop, and the policy rooms (`breaker`,
//! `limit`, `retry`, `jitter`, `flight`, `l1`, `freshness`, `entry`,
//! `codec`) reach neither the cache nor the metrics room.
//!
//! "Depends" is read from the source, comments, strings and inline test
//! modules left out:
//!
//! - a path (in a `use` or inline) that names an item of another file:
//!   `crate::…`, `super::…`, `self::…`, or a child module's name; a path
//!   through a re-export (`pub use`) leads to the file the item is defined
//!   in, and the re-export itself is no dependency (a parent that declares
//!   `mod child;` and re-exports its items is fine);
//! - a call `self.f(…)`, `cache.f(…)`, `inner.f(…)` or `Self::f(…)` of a
//!   method `f` defined in an inherent `impl` block in another file than
//!   its type (the cache's steps each add methods to `Cache`).
//!
//! A heuristic, not a compiler: it sees what is written, so an edge it
//! misses is possible (a method called on another receiver name), a loop
//! it reports is real.
//!
//! ```sh
//! cargo test -p breakwater-cache --test layers -- --nocapture
//! BREAKWATER_LAYERS=print cargo test -p breakwater-cache --test layers -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace's crates whose sources are checked.
const CRATES: &[&str] = &[
    "crates/breakwater-cache/src",
    "crates/breakwater-cache-cli/src",
    "crates/breakwater-cache-testkit/src",
    "examples/catalog/src",
];

/// Policies: one concept each, below the cache and the metrics room.
const POLICIES: &[&str] = &[
    "breaker",
    "limit",
    "retry",
    "jitter",
    "flight",
    "l1",
    "freshness",
    "entry",
    "codec",
];

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Punct(char),
}

struct File {
    /// Relative to the crate's `src`.
    path: String,
    /// Its module path (`[]` for the crate root).
    module: Vec<String>,
    toks: Vec<(Tok, usize)>,
}

/// Source text without comments, string and char literals (newlines kept).
fn strip(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !b
                .get(i.wrapping_sub(1))
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if b[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                } else if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let mut toks = Vec::new();
    let mut line = 1;
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphabetic() || c == '_' {
            let mut ident = String::from(c);
            while let Some(&n) = chars.peek() {
                if n.is_alphanumeric() || n == '_' {
                    ident.push(n);
                    chars.next();
                } else {
                    break;
                }
            }
            toks.push((Tok::Ident(ident), line));
        } else if !c.is_whitespace() {
            toks.push((Tok::Punct(c), line));
        }
    }
    toks
}

/// The tokens without inline `mod name { … }` blocks (test modules: their
/// `super` is the file itself, and tests do not make layers).
fn without_inline_mods(toks: Vec<(Tok, usize)>) -> Vec<(Tok, usize)> {
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let is_mod = toks[i].0 == Tok::Ident("mod".into())
            && matches!(toks.get(i + 1), Some((Tok::Ident(_), _)))
            && toks.get(i + 2).map(|t| &t.0) == Some(&Tok::Punct('{'));
        if !is_mod {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        let mut depth = 0;
        i += 2;
        while i < toks.len() {
            match toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn is(t: Option<&(Tok, usize)>, c: char) -> bool {
    matches!(t, Some((Tok::Punct(p), _)) if *p == c)
}

fn is_path_sep(toks: &[(Tok, usize)], i: usize) -> bool {
    is(toks.get(i), ':') && is(toks.get(i + 1), ':')
}

/// One `use` tree flattened: each leaf path (`self` leaves name the module
/// itself), with its alias.
fn use_leaves(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) -> usize {
    let mut path = prefix;
    loop {
        match toks.get(i) {
            Some((Tok::Punct('{'), _)) => {
                i += 1;
                loop {
                    i = use_leaves(toks, i, path.clone(), out);
                    if is(toks.get(i), ',') {
                        i += 1;
                    }
                    if is(toks.get(i), '}') {
                        return i + 1;
                    }
                    if i >= toks.len() {
                        return i;
                    }
                }
            }
            Some((Tok::Punct('*'), _)) => {
                out.push((path, "*".into()));
                return i + 1;
            }
            Some((Tok::Ident(s), _)) => {
                if s == "self" && !path.is_empty() {
                    let alias = path.last().cloned().unwrap_or_default();
                    out.push((path, alias));
                    return i + 1;
                }
                path.push(s.clone());
                i += 1;
                if is_path_sep(toks, i) {
                    i += 2;
                    continue;
                }
                let mut alias = s.clone();
                if ident(toks.get(i)) == Some("as") {
                    alias = ident(toks.get(i + 1)).unwrap_or("_").to_string();
                    i += 2;
                }
                out.push((path, alias));
                return i;
            }
            _ => return i,
        }
    }
}

/// One `use` leaf of a file: the absolute path, its alias, its line, and
/// whether it is a re-export.
type UseLeaf = (Vec<String>, String, usize, bool);

/// What a file defines, re-exports and uses.
type Scanned = (BTreeSet<String>, HashMap<String, Vec<String>>, Vec<UseLeaf>);

struct Crate {
    files: Vec<File>,
    /// Module path → file index.
    by_module: HashMap<Vec<String>, usize>,
    /// Per file: top-level item names it defines.
    defines: Vec<BTreeSet<String>>,
    /// Per file: re-exported name → the path it points at (absolute).
    reexports: Vec<HashMap<String, Vec<String>>>,
    /// `macro_rules!` name → the file it is written in.
    macros: HashMap<String, usize>,
    /// Per file: every `use` leaf, absolute (alias → path).
    uses: Vec<Vec<UseLeaf>>,
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut paths = Vec::new();
        walk(src, &mut paths);
        paths.sort();
        let mut files = Vec::new();
        for p in paths {
            let rel = p
                .strip_prefix(src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let mut module: Vec<String> = rel
                .trim_end_matches(".rs")
                .split('/')
                .map(String::from)
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            let text = fs::read_to_string(&p).unwrap();
            let toks = without_inline_mods(tokens(&strip(&text)));
            files.push(File {
                path: rel,
                module,
                toks,
            });
        }
        // A binary beside a library (two roots): keep the library's.
        let by_module = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .rev()
            .collect();
        let mut macros = HashMap::new();
        for (f, file) in files.iter().enumerate() {
            for w in 0..file.toks.len().saturating_sub(2) {
                if ident(file.toks.get(w)) == Some("macro_rules")
                    && let Some(name) = ident(file.toks.get(w + 2))
                {
                    macros.entry(name.to_string()).or_insert(f);
                }
            }
        }
        let mut krate = Crate {
            macros,
            files,
            by_module,
            defines: Vec::new(),
            reexports: Vec::new(),
            uses: Vec::new(),
        };
        for i in 0..krate.files.len() {
            let (defines, reexports, uses) = krate.scan(i);
            krate.defines.push(defines);
            krate.reexports.push(reexports);
            krate.uses.push(uses);
        }
        krate
    }

    /// A path as written in file `f`, made absolute; `None` for another
    /// crate's path.
    fn absolute(&self, f: usize, path: &[String]) -> Option<Vec<String>> {
        let module = &self.files[f].module;
        let first = path.first()?;
        let mut out = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.clone(),
            "super" => {
                let mut m = module.clone();
                let mut rest = path;
                while rest.first().map(String::as_str) == Some("super") {
                    m.pop();
                    rest = &rest[1..];
                }
                m.extend(rest.iter().cloned());
                return Some(m);
            }
            _ => {
                let mut child = module.clone();
                child.push(first.clone());
                if self.by_module.contains_key(&child) {
                    module.clone()
                } else {
                    return None;
                }
            }
        };
        let skip = usize::from(matches!(first.as_str(), "crate" | "self"));
        out.extend(path[skip..].iter().cloned());
        Some(out)
    }

    fn scan(&self, f: usize) -> Scanned {
        let toks = &self.files[f].toks;
        let mut defines = BTreeSet::new();
        let mut reexports = HashMap::new();
        let mut uses = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < toks.len() {
            match &toks[i].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth -= 1,
                Tok::Ident(kw) if depth == 0 => match kw.as_str() {
                    "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" => {
                        if let Some(name) = ident(toks.get(i + 1)) {
                            defines.insert(name.to_string());
                        }
                    }
                    "macro_rules" => {
                        if let Some(name) = ident(toks.get(i + 2)) {
                            defines.insert(name.to_string());
                        }
                    }
                    "use" => {
                        let public = i > 0
                            && (ident(toks.get(i - 1)) == Some("pub")
                                || (is(toks.get(i - 1), ')')
                                    && (1..6).any(|k| {
                                        ident(toks.get(i.saturating_sub(k))) == Some("pub")
                                    })));
                        let line = toks[i].1;
                        let mut leaves = Vec::new();
                        i = use_leaves(toks, i + 1, Vec::new(), &mut leaves);
                        for (path, alias) in leaves {
                            if let Some(abs) = self.absolute(f, &path) {
                                if public && alias != "*" {
                                    reexports.insert(alias.clone(), abs.clone());
                                }
                                uses.push((abs, alias, line, public));
                            }
                        }
                        continue;
                    }
                    _ => {}
                },
                _ => {}
            }
            i += 1;
        }
        (defines, reexports, uses)
    }

    /// The file that defines what absolute path `path` names (through
    /// modules and re-exports).
    fn resolve(&self, path: &[String], hops: usize) -> Option<usize> {
        let mut cur = *self.by_module.get(&Vec::new())?;
        let mut module = Vec::new();
        for seg in path {
            module.push(seg.clone());
            if let Some(&child) = self.by_module.get(&module) {
                cur = child;
                continue;
            }
            if self.defines[cur].contains(seg) {
                return Some(cur);
            }
            if hops < 8
                && let Some(target) = self.reexports[cur].get(seg)
            {
                return self.resolve(target, hops + 1).or(Some(cur));
            }
            // A `#[macro_export]` macro is at the crate's root, written
            // wherever its `macro_rules!` is.
            if module.len() == 1
                && let Some(f) = self.macros.get(seg)
            {
                return Some(*f);
            }
            return Some(cur);
        }
        Some(cur)
    }

    /// Edges `from → to` with the first place seen.
    fn edges(&self) -> BTreeMap<(usize, usize), String> {
        let mut edges = BTreeMap::new();
        let mut add = |from: usize, to: Option<usize>, why: String| {
            if let Some(to) = to
                && to != from
            {
                edges.entry((from, to)).or_insert(why);
            }
        };
        // Where each type is defined, and the methods spread over files.
        let mut type_files: HashMap<&str, BTreeSet<usize>> = HashMap::new();
        for (f, file) in self.files.iter().enumerate() {
            let toks = &file.toks;
            for w in 0..toks.len().saturating_sub(1) {
                if matches!(ident(toks.get(w)), Some("struct" | "enum" | "trait"))
                    && let Some(name) = ident(toks.get(w + 1))
                {
                    type_files.entry(name).or_default().insert(f);
                }
            }
        }
        let mut spread: HashMap<String, BTreeSet<usize>> = HashMap::new();
        let mut own: Vec<BTreeSet<String>> = vec![BTreeSet::new(); self.files.len()];
        for (f, file) in self.files.iter().enumerate() {
            // Every function the file itself defines or declares (its own
            // methods, a trait's): a call of one of those names is taken
            // for its own.
            for w in 0..file.toks.len().saturating_sub(1) {
                if ident(file.toks.get(w)) == Some("fn")
                    && let Some(name) = ident(file.toks.get(w + 1))
                {
                    own[f].insert(name.to_string());
                }
            }
            for (ty, methods) in inherent_impls(&file.toks) {
                if type_files.get(ty.as_str()).is_some_and(|d| !d.contains(&f)) {
                    for m in methods {
                        spread.entry(m).or_default().insert(f);
                    }
                }
            }
        }
        for (f, file) in self.files.iter().enumerate() {
            for (path, _, line, public) in &self.uses[f] {
                // A re-export of a child's item is the parent's table of
                // contents, not a dependency.
                let child_of_f = path.len() > file.module.len() && path.starts_with(&file.module);
                if *public && child_of_f {
                    continue;
                }
                add(
                    f,
                    self.resolve(path, 0),
                    format!("{}:{line} use {}", file.path, path.join("::")),
                );
            }
            let toks = &file.toks;
            let mut i = 0;
            while i < toks.len() {
                // Inline paths.
                if let Some(first) = ident(toks.get(i))
                    && is_path_sep(toks, i + 1)
                    && !(i >= 2 && is_path_sep(toks, i - 2))
                    && ident(toks.get(i.wrapping_sub(1))) != Some("use")
                {
                    let mut path = vec![first.to_string()];
                    let mut j = i + 1;
                    while is_path_sep(toks, j)
                        && let Some(next) = ident(toks.get(j + 2))
                    {
                        path.push(next.to_string());
                        j += 3;
                    }
                    // A path through a module imported by name (`use super::notify::{self, ..}`).
                    let abs = self.absolute(f, &path).or_else(|| {
                        let (target, _, _, _) = self.uses[f]
                            .iter()
                            .find(|(_, alias, _, _)| alias == first)?;
                        let mut abs = target.clone();
                        abs.extend(path[1..].iter().cloned());
                        self.by_module.contains_key(target).then_some(abs)
                    });
                    if let Some(abs) = abs {
                        add(
                            f,
                            self.resolve(&abs, 0),
                            format!("{}:{} {}", file.path, toks[i].1, path.join("::")),
                        );
                    }
                    i = j;
                    continue;
                }
                // Method calls of spread impls.
                if let Some(name) = ident(toks.get(i))
                    && is(toks.get(i + 1), '(')
                    && let Some(defined) = spread.get(name)
                    && !own[f].contains(name)
                {
                    let receiver = (is(toks.get(i.wrapping_sub(1)), '.')
                        && matches!(
                            ident(toks.get(i.wrapping_sub(2))),
                            Some("self" | "cache" | "inner")
                        ))
                        || (i >= 3
                            && is_path_sep(toks, i - 2)
                            && ident(toks.get(i - 3)) == Some("Self"));
                    if receiver {
                        for &d in defined {
                            add(
                                f,
                                Some(d),
                                format!("{}:{} .{name}(…)", file.path, toks[i].1),
                            );
                        }
                    }
                }
                i += 1;
            }
        }
        edges
    }
}

/// Inherent `impl Type { … }` blocks at the top level: the type's name and
/// the methods defined.
fn inherent_impls(toks: &[(Tok, usize)]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => depth -= 1,
            Tok::Ident(kw) if kw == "impl" && depth == 0 => {
                // The header, up to its `{`.
                let mut j = i + 1;
                let mut angle = 0;
                let mut header = Vec::new();
                while j < toks.len() && !(angle == 0 && is(toks.get(j), '{')) {
                    match toks[j].0 {
                        Tok::Punct('<') => angle += 1,
                        Tok::Punct('>') if !is(toks.get(j - 1), '-') => angle -= 1,
                        _ => {}
                    }
                    header.push((angle, toks[j].0.clone()));
                    j += 1;
                }
                let is_trait = header
                    .iter()
                    .any(|(a, t)| *a == 0 && *t == Tok::Ident("for".into()));
                let ty = header.iter().find_map(|(a, t)| match t {
                    Tok::Ident(s) if *a == 0 && s != "where" => Some(s.clone()),
                    _ => None,
                });
                // The body.
                let mut methods = Vec::new();
                let mut d = 0;
                let mut k = j;
                while k < toks.len() {
                    match toks[k].0 {
                        Tok::Punct('{') => d += 1,
                        Tok::Punct('}') => {
                            d -= 1;
                            if d == 0 {
                                break;
                            }
                        }
                        Tok::Ident(ref s) if s == "fn" && d == 1 => {
                            if let Some(name) = ident(toks.get(k + 1)) {
                                methods.push(name.to_string());
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                if !is_trait && let Some(ty) = ty {
                    out.push((ty, methods));
                }
                i = k + 1;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Strongly connected components of more than one file (Tarjan).
fn loops(n: usize, edges: &BTreeMap<(usize, usize), String>) -> Vec<Vec<usize>> {
    let mut adj = vec![Vec::new(); n];
    for &(a, b) in edges.keys() {
        adj[a].push(b);
    }
    struct T<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(t: &mut T<'_>, v: usize) {
        t.index[v] = Some(t.next);
        t.low[v] = t.next;
        t.next += 1;
        t.stack.push(v);
        t.on[v] = true;
        for &w in &t.adj[v].clone() {
            match t.index[w] {
                None => {
                    visit(t, w);
                    t.low[v] = t.low[v].min(t.low[w]);
                }
                Some(iw) if t.on[w] => t.low[v] = t.low[v].min(iw),
                _ => {}
            }
        }
        if Some(t.low[v]) == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        adj: &adj,
        index: vec![None; n],
        low: vec![0; n],
        on: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if t.index[v].is_none() {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The workspace checked: this one, or another checkout's root named by
/// `BREAKWATER_LAYERS_ROOT` (to compare with an older tree).
fn workspace() -> PathBuf {
    match std::env::var_os("BREAKWATER_LAYERS_ROOT") {
        Some(root) => PathBuf::from(root),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

#[test]
fn no_two_source_files_depend_on_each_other() {
    let mut report = String::new();
    let mut total = (0, 0);
    for dir in CRATES {
        let krate = Crate::load(&workspace().join(dir));
        let edges = krate.edges();
        // `BREAKWATER_LAYERS=print`: every file and what it uses.
        if std::env::var_os("BREAKWATER_LAYERS").is_some_and(|v| v == "print") {
            for (f, file) in krate.files.iter().enumerate() {
                let uses: Vec<_> = edges
                    .keys()
                    .filter(|(a, _)| *a == f)
                    .map(|(_, b)| krate.files[*b].path.trim_end_matches(".rs"))
                    .collect();
                println!("{dir}/{}: {}", file.path, uses.join(", "));
            }
        }
        total.0 += krate.files.len();
        total.1 += edges.len();
        for scc in loops(krate.files.len(), &edges) {
            let names: Vec<_> = scc.iter().map(|&f| krate.files[f].path.as_str()).collect();
            report.push_str(&format!("\n{dir}: a loop among {}:\n", names.join(", ")));
            for (&(a, b), why) in &edges {
                if scc.contains(&a) && scc.contains(&b) {
                    report.push_str(&format!(
                        "  {} -> {}  ({why})\n",
                        krate.files[a].path, krate.files[b].path
                    ));
                }
            }
        }
    }
    println!("{} files, {} dependencies between files", total.0, total.1);
    assert!(report.is_empty(), "import loops:{report}");
    println!("no loop");
}

#[test]
fn policies_reach_neither_the_cache_nor_the_metrics() {
    let krate = Crate::load(&workspace().join(CRATES[0]));
    let edges = krate.edges();
    let mut adj: HashMap<usize, Vec<usize>> = HashMap::new();
    for &(a, b) in edges.keys() {
        adj.entry(a).or_default().push(b);
    }
    let mut report = String::new();
    for policy in POLICIES {
        let start = krate.by_module[&vec![policy.to_string()]];
        let mut seen = BTreeSet::from([start]);
        let mut todo = vec![start];
        while let Some(f) = todo.pop() {
            for &g in adj.get(&f).into_iter().flatten() {
                if seen.insert(g) {
                    todo.push(g);
                }
            }
        }
        for f in seen {
            let path = &krate.files[f].path;
            if path.starts_with("cache/") || path == "metrics.rs" {
                report.push_str(&format!("\n{policy} reaches {path}"));
            }
        }
    }
    assert!(
        report.is_empty(),
        "policies above the ground floor:{report}"
    );
}

//! The generated files of a target's folder: one per trait, with its impl, the `use` items
//! its signatures need and a header; and `mod.rs`, which declares them and brings in what they
//! share. Each is formatted with rustfmt.

mod fast_flex;
mod method;
mod profiled;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;
use syn::{Item, TraitItem, Visibility};

use crate::parse::{
    Crate, SourceFile, burn_backend_src, collect_use, mentions, own_methods, single_type_param,
};
#[cfg(doc)]
use crate::targets::OpsTrait;
use crate::targets::{Body, TRAITS, Target, is_forwarded};
use method::MethodCtx;

/// What [`generate`] produced.
pub struct Generated {
    /// The files of the target's folder, formatted, by name: `mod.rs` and one file per trait
    /// ([`OpsTrait::module`]).
    pub files: BTreeMap<String, String>,
    /// burn-backend's version.
    pub version: String,
    /// Methods emitted per trait, in [`TRAITS`] order.
    pub counts: Vec<(String, usize)>,
    /// Methods each trait declares, per trait, as read from its source.
    pub declared: Vec<(String, Vec<String>)>,
    /// Methods left to the trait's default, per trait ([`Body::Forward`]).
    pub defaulted: Vec<(String, Vec<String>)>,
}

/// The name of the folder's file that declares the trait modules.
pub const MOD_FILE: &str = "mod.rs";

/// Generates the target folder's files, formatted, from the burn-backend that `root`'s
/// workspace uses.
pub fn generate(root: &Path, target: &Target) -> Result<Generated> {
    let (src, version) = burn_backend_src(root)?;
    let krate = Crate::load(&src, version)?;
    let overridden = match target.body {
        Body::Record => None,
        Body::Forward { to, package, .. } => Some(own_methods(root, package, to)?),
    };
    let mut found = BTreeMap::new();
    for file in krate.files.values() {
        if !krate.is_trait_file(&file.module) {
            continue;
        }
        for item in &file.ast.items {
            if let Item::Trait(item) = item
                && is_forwarded(&item.ident.to_string())
            {
                ensure!(
                    matches!(item.vis, Visibility::Public(_)),
                    "trait {} is not public",
                    item.ident
                );
                if found.insert(item.ident.to_string(), (file, item)).is_some() {
                    bail!("trait {} is defined twice in burn-backend", item.ident);
                }
            }
        }
    }
    // The names `mod.rs` brings in for the trait modules.
    let uses = syn::parse_file(target.uses)
        .with_context(|| format!("the `uses` of {} do not parse", target.implementor))?;
    let mut shared = BTreeMap::new();
    for item in &uses.items {
        let Item::Use(item) = item else {
            bail!(
                "the `uses` of {} hold an item that is not `use`",
                target.implementor
            );
        };
        let mut glob = false;
        collect_use(&item.tree, &mut Vec::new(), &mut shared, &mut glob);
        ensure!(!glob, "the `uses` of {} hold a glob", target.implementor);
    }
    let folder = root.join(target.output);
    let mut files = BTreeMap::new();
    let mut counts = Vec::new();
    let mut declared = Vec::new();
    let mut defaulted = Vec::new();
    // The parent module's functions that the trait modules call as `super::name`.
    let mut parent_fns = BTreeSet::new();
    for ops_trait in &TRAITS {
        let name = ops_trait.name;
        let (file, item) = found
            .get(name)
            .with_context(|| format!("trait {name} not found in burn-backend's sources"))?;
        let mut imports = Imports::default();
        if matches!(target.body, Body::Record) {
            imports.add("Backend", vec!["burn_backend".into(), "Backend".into()])?;
        }
        let (text, methods, left) =
            krate.trait_impl(file, item, target, overridden.as_ref(), &mut imports)?;
        defaulted.push((name.to_owned(), left));
        counts.push((name.to_owned(), methods.len()));
        let names = item
            .items
            .iter()
            .filter_map(|item| match item {
                TraitItem::Fn(f) => Some(f.sig.ident.to_string()),
                _ => None,
            })
            .collect();
        declared.push((name.to_owned(), names));

        let tokens: TokenStream = text
            .parse()
            .map_err(|e| anyhow::anyhow!("the impl of {name} does not parse: {e}"))?;
        super_paths(tokens.clone(), &mut parent_fns);
        let from_mod: Vec<&str> = shared
            .keys()
            .map(String::as_str)
            .filter(|shared| mentions(tokens.clone(), shared))
            .collect();
        let from_mod = match from_mod.as_slice() {
            [] => String::new(),
            [one] => format!("use super::{one};\n"),
            many => format!("use super::{{{}}};\n", many.join(", ")),
        };
        let doc = format!(
            "//! The forwarding of [`{name}`] for [`{}`], described in [the module](super).\n",
            target.implementor
        );
        let source = format!("`src/{}`", file.path);
        let unformatted = format!(
            "{}{}\n{from_mod}\n{text}",
            header(&doc, &krate.version, &source),
            imports.text(),
        );
        let file_name = format!("{}.rs", ops_trait.module);
        files.insert(file_name, rustfmt(&unformatted, &folder)?);
    }

    let modules: Vec<String> = TRAITS
        .iter()
        .map(|t| format!("mod {};\n", t.module))
        .collect();
    let parent_uses = if parent_fns.is_empty() {
        String::new()
    } else {
        format!(
            "// Functions of the parent module, which the trait modules call as `super::…`.\n\
             use super::{{{}}};\n",
            parent_fns.iter().cloned().collect::<Vec<_>>().join(", ")
        )
    };
    let unformatted = format!(
        "{}{}\n{}{parent_uses}",
        header(
            target.doc,
            &krate.version,
            "`src/backend/ops`, one module per trait"
        ),
        modules.concat(),
        target.uses,
    );
    files.insert(MOD_FILE.to_owned(), rustfmt(&unformatted, &folder)?);
    Ok(Generated {
        files,
        version: krate.version,
        counts,
        declared,
        defaulted,
    })
}

/// A generated file's header: its doc comment `doc`, then how it is generated from
/// burn-backend's sources (`source`, in parentheses).
fn header(doc: &str, version: &str, source: &str) -> String {
    format!(
        "{doc}//!\n\
         //! Generated by `cargo backend-ops` from burn-backend {version}'s sources\n\
         //! ({source}). Do not edit by hand: change the generator\n\
         //! (`xtask/backend-ops`) and run `cargo backend-ops` again;\n\
         //! `cargo test -p backend-ops` fails when this file is not what it writes.\n\n"
    )
}

/// Adds the names that `tokens` call as `super::name` to `names`.
fn super_paths(tokens: TokenStream, names: &mut BTreeSet<String>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    for (i, tree) in trees.iter().enumerate() {
        match tree {
            TokenTree::Ident(ident) if ident == "super" => {
                if let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(name)),
                ) = (trees.get(i + 1), trees.get(i + 2), trees.get(i + 3))
                    && a.as_char() == ':'
                    && b.as_char() == ':'
                {
                    names.insert(name.to_string());
                }
            }
            TokenTree::Group(group) => super_paths(group.stream(), names),
            _ => {}
        }
    }
}

/// Formats `code` with `rustfmt --edition 2024`, run in the generated folder `folder` (or,
/// before it exists, the nearest folder above it), so that it finds the configuration
/// `cargo fmt` would.
fn rustfmt(code: &str, folder: &Path) -> Result<String> {
    let dir = folder
        .ancestors()
        .find(|dir| dir.is_dir())
        .expect("the workspace root exists");
    let mut child = Command::new("rustfmt")
        .args(["--edition", "2024"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("could not run rustfmt")?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let input = code.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().context("rustfmt did not finish")?;
    writer
        .join()
        .expect("the writer thread does not panic")
        .context("could not write to rustfmt")?;
    ensure!(
        output.status.success(),
        "rustfmt failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).context("rustfmt wrote non-UTF-8 text")
}

/// The `use` items of the generated file: name to absolute path.
#[derive(Default)]
pub struct Imports {
    names: BTreeMap<String, Vec<String>>,
}

impl Imports {
    pub fn add(&mut self, name: &str, path: Vec<String>) -> Result<()> {
        match self.names.get(name) {
            Some(known) if *known != path => bail!(
                "`{name}` means both `{}` and `{}` in burn-backend's traits",
                known.join("::"),
                path.join("::")
            ),
            _ => {
                self.names.insert(name.to_owned(), path);
                Ok(())
            }
        }
    }

    /// One `use` line per module, sorted.
    fn text(&self) -> String {
        let mut by_module: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (name, path) in &self.names {
            let (last, module) = path.split_last().expect("paths are not empty");
            let item = if last == name {
                name.clone()
            } else {
                format!("{last} as {name}")
            };
            by_module.entry(module.join("::")).or_default().insert(item);
        }
        let mut out = String::new();
        for (module, items) in by_module {
            let items: Vec<_> = items.into_iter().collect();
            if items.len() == 1 {
                out.push_str(&format!("use {module}::{};\n", items[0]));
            } else {
                out.push_str(&format!("use {module}::{{{}}};\n", items.join(", ")));
            }
        }
        out
    }
}

impl Crate {
    /// The impl of one trait (as text), and the names of its methods.
    fn trait_impl(
        &self,
        file: &SourceFile,
        item: &syn::ItemTrait,
        target: &Target,
        overridden: Option<&BTreeSet<(String, String)>>,
        imports: &mut Imports,
    ) -> Result<(String, Vec<String>, Vec<String>)> {
        let name = &item.ident;
        let param = single_type_param(&item.generics)
            .with_context(|| format!("trait {name} should have one type parameter"))?;
        ensure!(
            item.generics.params.len() == 1,
            "trait {name} should have one generic parameter"
        );
        self.import(file, &name.to_string(), name.to_string().as_str(), imports)?;
        let mut methods = Vec::new();
        let mut names = Vec::new();
        let mut left = Vec::new();
        for trait_item in &item.items {
            match trait_item {
                TraitItem::Fn(f) => {
                    let method = f.sig.ident.to_string();
                    if let (Some(overridden), Body::Forward { via_f32, own, .. }) =
                        (overridden, &target.body)
                        && f.default.is_some()
                        && !overridden.contains(&(name.to_string(), method.clone()))
                        && !via_f32.contains(&method.as_str())
                        && !own.contains(&method.as_str())
                    {
                        left.push(method);
                        continue;
                    }
                    let ctx = MethodCtx {
                        krate: self,
                        file,
                        param: &param,
                        method: f.sig.ident.to_string(),
                        body: &target.body,
                    };
                    methods.push(ctx.method(f, imports)?);
                    names.push(f.sig.ident.to_string());
                }
                other => bail!(
                    "trait {name} has an item that is not a method: {}",
                    other.to_token_stream()
                ),
            }
        }
        // Written as text so that a blank line separates the methods (rustfmt keeps it).
        let methods: Vec<String> = methods.iter().map(ToString::to_string).collect();
        let text = format!(
            "impl{} {name}<Self> for {} {{\n{}\n}}\n",
            target.generics,
            target.implementor,
            methods.join("\n\n")
        );
        Ok((text, names, left))
    }
}

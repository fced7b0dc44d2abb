//! Where a name that a trait's signatures use is reachable from outside burn-backend: the
//! `use` items the generated files need.

use anyhow::{Context, Result, bail, ensure};
use syn::{Item, UseTree, Visibility};

use super::{Crate, SourceFile};
use crate::emit::Imports;

/// Names in the Rust 2024 prelude (and primitive types): never imported.
const PRELUDE: &[&str] = &[
    "Option",
    "Some",
    "None",
    "Result",
    "Ok",
    "Err",
    "Vec",
    "String",
    "Box",
    "Send",
    "Sync",
    "Sized",
    "Unpin",
    "Copy",
    "Clone",
    "Default",
    "Drop",
    "Fn",
    "FnMut",
    "FnOnce",
    "Future",
    "IntoFuture",
    "Iterator",
    "IntoIterator",
    "DoubleEndedIterator",
    "ExactSizeIterator",
    "Extend",
    "FromIterator",
    "From",
    "Into",
    "TryFrom",
    "TryInto",
    "AsRef",
    "AsMut",
    "PartialEq",
    "Eq",
    "PartialOrd",
    "Ord",
    "ToOwned",
    "ToString",
    "bool",
    "char",
    "str",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "i128",
    "isize",
    "u8",
    "u16",
    "u32",
    "u64",
    "u128",
    "usize",
    "Self",
];

impl Crate {
    /// The public path, from outside burn-backend, of the crate-relative path `path`: modules
    /// that their parent re-exports with a glob (`mod base; pub use base::*;`) are left out;
    /// a private module not so re-exported is an error.
    fn public_path(&self, path: &[String]) -> Result<Vec<String>> {
        let mut out = vec!["burn_backend".to_owned()];
        let Some((last, modules)) = path.split_last() else {
            bail!("empty path");
        };
        let mut items = self
            .module_items(&[])
            .context("burn-backend has no src/lib.rs")?;
        for (i, segment) in modules.iter().enumerate() {
            let declared = items.iter().find_map(|item| match item {
                Item::Mod(m) if m.ident == segment => Some(m.vis.clone()),
                _ => None,
            });
            let Some(vis) = declared else {
                // Not a module declared here (a re-export): kept as written.
                out.extend(path[i..].iter().cloned());
                return Ok(out);
            };
            let glob = items.iter().any(|item| match item {
                Item::Use(u) if matches!(u.vis, Visibility::Public(_)) => {
                    matches!(&u.tree, UseTree::Path(p)
                        if p.ident == segment && matches!(*p.tree, UseTree::Glob(_)))
                }
                _ => false,
            });
            if !glob {
                ensure!(
                    matches!(vis, Visibility::Public(_)),
                    "`crate::{}` is not reachable from outside burn-backend",
                    path.join("::")
                );
                out.push(segment.clone());
            }
            items = self
                .module_items(&modules[..=i])
                .with_context(|| format!("module `crate::{}` not found", modules.join("::")))?;
        }
        out.push(last.clone());
        Ok(out)
    }

    /// Resolves a path written in `file` that starts with `crate`, `super` or `self`.
    pub fn resolve_relative(&self, file: &SourceFile, path: &[String]) -> Result<Vec<String>> {
        let mut absolute = Vec::new();
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate") => rest = &path[1..],
            Some("self") => {
                absolute.extend(file.module.iter().cloned());
                rest = &path[1..];
            }
            Some("super") => {
                absolute.extend(file.module.iter().cloned());
                while rest.first().is_some_and(|s| s == "super") {
                    ensure!(
                        absolute.pop().is_some(),
                        "`{}` goes above the crate",
                        path.join("::")
                    );
                    rest = &rest[1..];
                }
            }
            _ => bail!("`{}` is not a relative path", path.join("::")),
        }
        absolute.extend(rest.iter().cloned());
        self.public_path(&absolute)
    }

    /// The path from outside burn-backend of a path as written in a `use` item of `file`.
    fn use_path(&self, file: &SourceFile, path: &[String]) -> Result<Vec<String>> {
        match path[0].as_str() {
            "crate" | "self" | "super" => self.resolve_relative(file, path),
            // burn-backend re-exports what backends need of burn_std at the same paths
            // (`pub use burn_std::{..}`, `shape`, `slice`, `quantization`); the compiler checks.
            "burn_std" => Ok(std::iter::once("burn_backend".to_owned())
                .chain(path[1..].iter().cloned())
                .collect()),
            "alloc" => Ok(std::iter::once("std".to_owned())
                .chain(path[1..].iter().cloned())
                .collect()),
            "core" | "std" => Ok(path.to_vec()),
            other => bail!(
                "`{}` comes from the crate `{other}`, which burn-memory does not depend on",
                path.join("::")
            ),
        }
    }

    /// Adds the `use` item that a name written in `file`'s signatures needs.
    pub fn import(
        &self,
        file: &SourceFile,
        name: &str,
        method: &str,
        imports: &mut Imports,
    ) -> Result<()> {
        let path = if let Some(path) = file.uses.get(name) {
            self.use_path(file, path)?
        } else if file.defined.contains(name) {
            let mut path = file.module.clone();
            path.push(name.to_owned());
            self.public_path(&path)?
        } else if PRELUDE.contains(&name) {
            return Ok(());
        } else {
            bail!(
                "`{method}`: the name `{name}` is not imported by {} (glob imports there: {})",
                file.module.join("/"),
                file.has_glob
            );
        };
        if PRELUDE.contains(&name) && matches!(path[0].as_str(), "std" | "core") {
            return Ok(());
        }
        imports.add(name, path)
    }
}

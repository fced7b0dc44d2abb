//! burn-backend's sources, parsed: the files that hold the traits, the type aliases and
//! the structs and enums generic over the backend that their signatures name, and where a
//! name is reachable from outside burn-backend ([`paths`]); what each parameter and return
//! type holds ([`classify`]); and, for [`Body::Forward`](crate::targets::Body::Forward), the
//! methods the inner backend's package implements itself ([`own_methods`]).

pub mod classify;
mod paths;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use proc_macro2::{Ident, TokenStream, TokenTree};
use syn::{GenericParam, Item, Type, UseTree, Visibility};

use crate::targets::is_forwarded;

/// The files of burn-backend (relative to its `src`) that hold the traits.
const TRAIT_FILES: [&str; 5] = [
    "backend/ops/tensor.rs",
    "backend/ops/int_tensor.rs",
    "backend/ops/bool_tensor.rs",
    "backend/ops/activation.rs",
    "backend/ops/qtensor.rs",
];
/// The folder whose every file is searched too (`ModuleOps` is in its `base.rs`).
const TRAIT_DIR: &str = "backend/ops/modules";

/// A parsed file of burn-backend.
pub struct SourceFile {
    /// Its module path, without the crate (`["backend", "ops", "tensor"]`).
    pub module: Vec<String>,
    /// Its path relative to `src`, with `/` between folders (`backend/ops/tensor.rs`).
    pub path: String,
    pub ast: syn::File,
    /// Names brought in by its `use` items, with the path as written.
    uses: BTreeMap<String, Vec<String>>,
    /// Whether it has a glob `use` (a name resolved nowhere else may come from it).
    has_glob: bool,
    /// Names of the items it defines at top level.
    defined: BTreeSet<String>,
}

/// A struct generic over the backend whose fields are all public, or an enum generic over
/// the backend.
struct BackendType {
    param: String,
    shape: TypeShape,
}

enum TypeShape {
    Struct(Vec<(Ident, Type)>),
    Enum(Vec<(Ident, syn::Fields)>),
}

/// burn-backend's sources, parsed.
pub struct Crate {
    pub version: String,
    /// By module path.
    pub files: BTreeMap<Vec<String>, SourceFile>,
    /// Type aliases `Alias<B> = <B as BackendTypes>::Assoc` (`FloatTensor`, `Device`), by
    /// alias name: the associated type.
    pub aliases: BTreeMap<String, String>,
    /// Structs and enums generic over the backend, by name; `None` where two share a name.
    types: BTreeMap<String, Option<BackendType>>,
}

/// burn-backend's `src` folder and version, from `cargo metadata`.
pub fn burn_backend_src(root: &Path) -> Result<(PathBuf, String)> {
    package_src(root, "burn-backend")
}

/// A package's `src` folder and version, from `cargo metadata` (the workspace must use
/// exactly one version of it).
pub fn package_src(root: &Path, name: &str) -> Result<(PathBuf, String)> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("could not run `cargo metadata`")?;
    ensure!(
        output.status.success(),
        "`cargo metadata` failed ({})",
        output.status
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("`cargo metadata` printed no JSON")?;
    let packages: Vec<_> = metadata["packages"]
        .as_array()
        .context("`cargo metadata` lists no packages")?
        .iter()
        .filter(|package| package["name"] == name)
        .collect();
    let [package] = packages.as_slice() else {
        bail!(
            "the workspace should use exactly one {name}, it uses {}",
            packages.len()
        );
    };
    let manifest = package["manifest_path"]
        .as_str()
        .with_context(|| format!("{name} has no manifest_path"))?;
    let version = package["version"]
        .as_str()
        .with_context(|| format!("{name} has no version"))?;
    let src = Path::new(manifest)
        .parent()
        .with_context(|| format!("{name}'s manifest path has no folder"))?
        .join("src");
    ensure!(
        src.is_dir(),
        "{name}'s sources are not at {} (run `cargo fetch`)",
        src.display()
    );
    Ok((src, version.to_owned()))
}

/// The `(trait, method)` pairs that `package` implements itself for its type `to`: the `fn`s
/// of its `impl Trait<To> for To` blocks, in every source file.
pub fn own_methods(root: &Path, package: &str, to: &str) -> Result<BTreeSet<(String, String)>> {
    let (src, _) = package_src(root, package)?;
    let mut found = BTreeSet::new();
    let mut stack = vec![src];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("{}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("could not read {}", path.display()))?;
            let ast = syn::parse_file(&text)
                .with_context(|| format!("could not parse {}", path.display()))?;
            collect_own(&ast.items, to, &mut found);
        }
    }
    ensure!(
        !found.is_empty(),
        "{package} implements no operation trait for {to}"
    );
    Ok(found)
}

fn collect_own(items: &[Item], to: &str, found: &mut BTreeSet<(String, String)>) {
    for item in items {
        match item {
            Item::Impl(block) => {
                let Some((_, path, _)) = &block.trait_ else {
                    continue;
                };
                let trait_name = path.segments.last().expect("a path").ident.to_string();
                let for_to = matches!(&*block.self_ty, Type::Path(p)
                    if p.path.segments.last().is_some_and(|s| s.ident == to));
                if !for_to || !is_forwarded(&trait_name) {
                    continue;
                }
                for item in &block.items {
                    if let syn::ImplItem::Fn(f) = item {
                        found.insert((trait_name.clone(), f.sig.ident.to_string()));
                    }
                }
            }
            Item::Mod(module) => {
                if let Some((_, items)) = &module.content {
                    collect_own(items, to, found);
                }
            }
            _ => {}
        }
    }
}

impl Crate {
    /// Parses every file under `src`.
    pub fn load(src: &Path, version: String) -> Result<Self> {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir)
                .with_context(|| format!("could not list {}", dir.display()))?
            {
                let path = entry?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    let rel = path.strip_prefix(src).expect("under src");
                    let module = module_path(rel);
                    let rel = rel
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("could not read {}", path.display()))?;
                    let ast = syn::parse_file(&text)
                        .with_context(|| format!("could not parse {}", path.display()))?;
                    files.insert(module.clone(), SourceFile::new(module, rel, ast));
                }
            }
        }
        let mut krate = Self {
            version,
            files,
            aliases: BTreeMap::new(),
            types: BTreeMap::new(),
        };
        krate.collect_types();
        for file in TRAIT_FILES {
            ensure!(
                krate.files.contains_key(&module_path(Path::new(file))),
                "burn-backend has no src/{file}"
            );
        }
        Ok(krate)
    }

    /// Whether the module is one of the trait files.
    pub fn is_trait_file(&self, module: &[String]) -> bool {
        let dir = module_path(Path::new(&format!("{TRAIT_DIR}/mod.rs")));
        TRAIT_FILES
            .iter()
            .any(|file| module_path(Path::new(file)) == module)
            || (module.len() == dir.len() + 1 && module.starts_with(&dir))
            || (module == dir)
    }

    /// Collects the backend type aliases and the structs and enums generic over the backend.
    fn collect_types(&mut self) {
        for file in self.files.values() {
            for item in &file.ast.items {
                match item {
                    Item::Type(alias) if matches!(alias.vis, Visibility::Public(_)) => {
                        let Some(param) = single_type_param(&alias.generics) else {
                            continue;
                        };
                        if let Some(assoc) = assoc_of(&alias.ty, &param) {
                            self.aliases.insert(alias.ident.to_string(), assoc);
                        }
                    }
                    Item::Struct(item) if matches!(item.vis, Visibility::Public(_)) => {
                        let Some(param) = single_type_param(&item.generics) else {
                            continue;
                        };
                        let syn::Fields::Named(fields) = &item.fields else {
                            continue;
                        };
                        if !fields
                            .named
                            .iter()
                            .all(|field| matches!(field.vis, Visibility::Public(_)))
                        {
                            continue;
                        }
                        let fields = fields
                            .named
                            .iter()
                            .map(|field| (field.ident.clone().expect("named"), field.ty.clone()))
                            .collect();
                        let shape = TypeShape::Struct(fields);
                        add_type(
                            &mut self.types,
                            item.ident.to_string(),
                            BackendType { param, shape },
                        );
                    }
                    Item::Enum(item) if matches!(item.vis, Visibility::Public(_)) => {
                        let Some(param) = single_type_param(&item.generics) else {
                            continue;
                        };
                        let variants = item
                            .variants
                            .iter()
                            .map(|v| (v.ident.clone(), v.fields.clone()))
                            .collect();
                        let shape = TypeShape::Enum(variants);
                        add_type(
                            &mut self.types,
                            item.ident.to_string(),
                            BackendType { param, shape },
                        );
                    }
                    _ => {}
                }
            }
        }
    }

    /// The items of a module, inline or in its own file.
    fn module_items(&self, module: &[String]) -> Option<Vec<Item>> {
        let mut items = self.files.get(&Vec::new())?.ast.items.clone();
        for (i, segment) in module.iter().enumerate() {
            let declared = items.iter().find_map(|item| match item {
                Item::Mod(m) if m.ident == segment => Some(m.clone()),
                _ => None,
            })?;
            items = match declared.content {
                Some((_, content)) => content,
                None => self.files.get(&module[..=i])?.ast.items.clone(),
            };
        }
        Some(items)
    }
}

impl SourceFile {
    fn new(module: Vec<String>, path: String, ast: syn::File) -> Self {
        let mut uses = BTreeMap::new();
        let mut has_glob = false;
        let mut defined = BTreeSet::new();
        for item in &ast.items {
            match item {
                Item::Use(u) => collect_use(&u.tree, &mut Vec::new(), &mut uses, &mut has_glob),
                Item::Struct(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Enum(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Trait(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Type(i) => {
                    defined.insert(i.ident.to_string());
                }
                Item::Fn(i) => {
                    defined.insert(i.sig.ident.to_string());
                }
                Item::Const(i) => {
                    defined.insert(i.ident.to_string());
                }
                _ => {}
            }
        }
        Self {
            module,
            path,
            ast,
            uses,
            has_glob,
            defined,
        }
    }
}

/// Registers a struct or enum generic over the backend; a second of the same name makes the
/// name ambiguous.
fn add_type(types: &mut BTreeMap<String, Option<BackendType>>, name: String, entry: BackendType) {
    types
        .entry(name)
        .and_modify(|known| *known = None)
        .or_insert(Some(entry));
}

/// The module path of a file under `src`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut module: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = module.pop().expect("a file name");
    let stem = file.strip_suffix(".rs").unwrap_or(&file);
    if !(stem == "mod" || (module.is_empty() && stem == "lib")) {
        module.push(stem.to_owned());
    }
    module
}

/// Adds the names that a `use` tree brings in to `uses`, with their paths as written (after
/// `prefix`); a glob sets `has_glob`.
pub fn collect_use(
    tree: &UseTree,
    prefix: &mut Vec<String>,
    uses: &mut BTreeMap<String, Vec<String>>,
    has_glob: &mut bool,
) {
    match tree {
        UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            collect_use(&path.tree, prefix, uses, has_glob);
            prefix.pop();
        }
        UseTree::Name(name) => {
            let mut path = prefix.clone();
            if name.ident == "self" {
                if let Some(last) = path.last().cloned() {
                    uses.insert(last, path);
                }
            } else {
                path.push(name.ident.to_string());
                uses.insert(name.ident.to_string(), path);
            }
        }
        UseTree::Rename(rename) => {
            let mut path = prefix.clone();
            path.push(rename.ident.to_string());
            uses.insert(rename.rename.to_string(), path);
        }
        UseTree::Glob(_) => *has_glob = true,
        UseTree::Group(group) => {
            for tree in &group.items {
                collect_use(tree, prefix, uses, has_glob);
            }
        }
    }
}

/// The single type parameter of an item's generics.
pub fn single_type_param(generics: &syn::Generics) -> Option<String> {
    let mut types = generics.params.iter().filter_map(|p| match p {
        GenericParam::Type(t) => Some(t.ident.to_string()),
        _ => None,
    });
    let first = types.next()?;
    types.next().is_none().then_some(first)
}

/// `Assoc` where `ty` is `P::Assoc` or `<P as Trait>::Assoc`, with `P` the parameter.
pub fn assoc_of(ty: &Type, param: &str) -> Option<String> {
    let Type::Path(path) = ty else {
        return None;
    };
    let segments = &path.path.segments;
    match &path.qself {
        Some(qself) => {
            let Type::Path(inner) = &*qself.ty else {
                return None;
            };
            (inner.qself.is_none()
                && inner.path.is_ident(param)
                && segments.len() == qself.position + 1)
                .then(|| segments.last().expect("one").ident.to_string())
        }
        None => (segments.len() == 2
            && segments[0].ident == param
            && segments.iter().all(|s| s.arguments.is_none()))
        .then(|| segments[1].ident.to_string()),
    }
}

/// Whether a token stream names `ident`.
pub fn mentions(tokens: TokenStream, ident: &str) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(i) => i == ident,
        TokenTree::Group(g) => mentions(g.stream(), ident),
        _ => false,
    })
}

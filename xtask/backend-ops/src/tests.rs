//! The generator's tests: the committed folders are what it writes now, and every method of
//! every trait is forwarded or, for `FastFlex`, deliberately left to its default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use syn::Item;

use super::*;
use crate::emit::MOD_FILE;
use crate::targets::{Body, TRAITS};

fn generated() -> Vec<Generated> {
    TARGETS
        .iter()
        .map(|target| generate(&workspace_root(), target).expect("the generator runs"))
        .collect()
}

/// Every file of each generated folder is what the generator writes now, byte for byte, and
/// the folder holds nothing else.
#[test]
fn generated_forwarding_is_current() {
    for (target, generated) in TARGETS.iter().zip(generated()) {
        let folder = workspace_root().join(target.output);
        for (name, code) in &generated.files {
            let path = folder.join(name);
            let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "could not read {}: {e}: run `cargo backend-ops` and commit the result",
                    path.display()
                )
            });
            assert!(
                committed == *code,
                "{}/{name} is not what the generator writes from burn-backend {}: run \
                 `cargo backend-ops` and commit the result",
                target.output,
                generated.version
            );
        }
        let stale = stale_files(&folder, &generated).expect("the folder can be listed");
        assert!(
            stale.is_empty(),
            "the generator does not write {stale:?}: run `cargo backend-ops` (which removes \
             them) and commit the result"
        );
    }
}

/// [`stale_files`] finds a file of the folder that the generator does not write, and the
/// module's file beside the folder; it leaves the generated files alone.
#[test]
fn stale_files_are_noticed() {
    let generated = &generated()[0];
    let dir = std::env::temp_dir().join(format!("backend-ops-stale-{}", std::process::id()));
    let folder = dir.join("ops");
    std::fs::create_dir_all(&folder).unwrap();
    let write = |path: &Path| std::fs::write(path, "").unwrap();
    for name in generated.files.keys() {
        write(&folder.join(name));
    }
    assert!(stale_files(&folder, generated).unwrap().is_empty());
    write(&folder.join("transaction.rs"));
    write(&dir.join("ops.rs"));
    let stale = stale_files(&folder, generated).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(stale, [folder.join("transaction.rs"), dir.join("ops.rs")]);
}

#[test]
fn every_trait_method_is_forwarded() {
    let generated = generated();
    for generated in &generated {
        every_method_emitted(generated);
    }
    // The profiler forwards every method. `FastFlex` writes Burn's `linear` itself (Flex
    // leaves it to the trait's default) and leaves the other defaults to the trait, so that
    // their decompositions run on `FastFlex`'s operations.
    assert!(
        generated[0]
            .defaulted
            .iter()
            .all(|(_, left)| left.is_empty())
    );
    let module = |list: &[(String, Vec<String>)]| {
        list.iter()
            .find(|(t, _)| t == "ModuleOps")
            .map(|(_, methods)| methods.clone())
            .unwrap_or_default()
    };
    let (left, declared) = (
        module(&generated[1].defaulted),
        module(&generated[1].declared),
    );
    assert!(declared.iter().any(|m| m == "linear") && !left.iter().any(|m| m == "linear"));
    assert!(!left.is_empty(), "some of Flex's defaults stay the trait's");
}

/// Every name the `FastFlex` lists give is a method of the traits (a renamed Burn
/// operation would otherwise silently leave the list).
#[test]
fn fast_flex_lists_name_trait_methods() {
    let generated = generated();
    let declared: BTreeSet<&str> = generated[1]
        .declared
        .iter()
        .flat_map(|(_, names)| names.iter().map(String::as_str))
        .collect();
    let Body::Forward { via_f32, own, .. } = &TARGETS[1].body else {
        panic!("FastFlex forwards");
    };
    for name in via_f32.iter().chain(own.iter()) {
        assert!(declared.contains(name), "{name} is not a trait method");
    }
    assert!(
        generated[1]
            .files
            .values()
            .any(|code| code.contains("super::to_f32(lhs)"))
    );
}

/// The folder holds `mod.rs`, which declares one module per trait, and that module's file,
/// which holds the trait's impl and no other; each impl has every method the trait declares
/// but those left to the default, in the trait's order.
fn every_method_emitted(generated: &Generated) {
    let module_file = |module: &str| format!("{module}.rs");
    let expected_files: BTreeSet<String> = TRAITS
        .iter()
        .map(|t| module_file(t.module))
        .chain([MOD_FILE.to_owned()])
        .collect();
    assert_eq!(
        generated.files.keys().cloned().collect::<BTreeSet<_>>(),
        expected_files
    );
    let mod_file = syn::parse_file(&generated.files[MOD_FILE]).expect("mod.rs parses");
    let declared_modules: BTreeSet<String> = mod_file
        .items
        .iter()
        .filter_map(|item| match item {
            Item::Mod(m) => {
                assert!(m.content.is_none(), "mod.rs declares an inline module");
                Some(m.ident.to_string())
            }
            Item::Impl(_) => panic!("mod.rs holds an impl"),
            _ => None,
        })
        .collect();
    assert_eq!(
        declared_modules,
        TRAITS.iter().map(|t| t.module.to_owned()).collect()
    );

    let mut emitted: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (file_name, code) in &generated.files {
        let file = syn::parse_file(code)
            .unwrap_or_else(|e| panic!("the generated {file_name} does not parse: {e}"));
        for item in &file.items {
            let Item::Impl(item) = item else {
                continue;
            };
            let Some((_, path, _)) = &item.trait_ else {
                continue;
            };
            let name = path.segments.last().unwrap().ident.to_string();
            let module = TRAITS
                .iter()
                .find(|t| t.name == name)
                .unwrap_or_else(|| panic!("{file_name} implements {name}, not forwarded"))
                .module;
            assert_eq!(
                *file_name,
                module_file(module),
                "the impl of {name} is not in its module"
            );
            let methods = item
                .items
                .iter()
                .filter_map(|item| match item {
                    syn::ImplItem::Fn(f) => Some(f.sig.ident.to_string()),
                    _ => None,
                })
                .collect();
            assert!(
                emitted.insert(name.clone(), methods).is_none(),
                "two impls of {name}"
            );
        }
    }
    assert_eq!(generated.declared.len(), TRAITS.len());
    for (name, declared) in &generated.declared {
        let methods = emitted
            .get(name)
            .unwrap_or_else(|| panic!("no impl of {name}"));
        let left = &generated
            .defaulted
            .iter()
            .find(|(trait_name, _)| trait_name == name)
            .unwrap_or_else(|| panic!("no defaults reported for {name}"))
            .1;
        // Emitted and left to the default: together, every declared method, in order.
        let mut all: Vec<&String> = methods.iter().chain(left).collect();
        let order = |m: &&String| declared.iter().position(|d| d == *m);
        all.sort_by_key(order);
        assert_eq!(
            all,
            declared.iter().collect::<Vec<_>>(),
            "{name}: the methods differ"
        );
        let count = generated
            .counts
            .iter()
            .find(|(trait_name, _)| trait_name == name)
            .map(|(_, count)| *count);
        assert_eq!(count, Some(methods.len()), "{name}: the reported count");
    }
    assert_eq!(emitted.len(), TRAITS.len());
}

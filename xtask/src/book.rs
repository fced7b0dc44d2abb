//! `cargo xtask book`: builds the mdBook under `docs/` and checks what a reader would hit first:
//! every chapter of `SUMMARY.md` became a page, no link between pages is broken, and (with
//! `--browser`) the pages load in a real browser with their table of contents drawn.
//!
//! The book's Rust blocks are not run here: they are doctests of the `examples` crate
//! (`examples/src/book.rs`), so `cargo test --workspace` holds them to the code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Options of `cargo xtask book`.
#[derive(Debug, clap::Args)]
pub struct BookArgs {
    /// The book's folder (the one holding `book.toml`).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs"))]
    pub docs: PathBuf,
    /// Also load the built pages in headless Chromium: the table of contents must list every
    /// chapter (mdBook draws it with JavaScript), and a screenshot of the first page is saved
    /// beside the book.
    #[arg(long)]
    pub browser: bool,
}

/// What the build and its checks found.
#[derive(Debug)]
pub struct BookReport {
    /// Where the HTML was written.
    pub out_dir: PathBuf,
    /// Chapters in `SUMMARY.md`, all of which have a page.
    pub chapters: usize,
    /// Links between pages that were followed and found.
    pub links_checked: usize,
    /// The screenshot, with `--browser`.
    pub screenshot: Option<PathBuf>,
}

/// Builds the book and checks it; an error names the first thing a reader would find broken.
pub fn run(args: &BookArgs) -> Result<BookReport> {
    let docs = args
        .docs
        .canonicalize()
        .with_context(|| format!("no book at {}", args.docs.display()))?;
    let version = Command::new("mdbook").arg("--version").output().context(
        "mdbook not found: install it with `cargo install mdbook --version '^0.4' --locked`",
    )?;
    eprintln!(
        "building with {}",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    let status = Command::new("mdbook")
        .arg("build")
        .arg(&docs)
        .status()
        .context("could not run mdbook")?;
    if !status.success() {
        bail!("mdbook build failed ({status})");
    }
    let out_dir = out_dir(&docs)?;
    // The README links into the book's sources; mdBook does not see it, so check it here.
    let broken = broken_links_in_sources(&docs.join("../README.md"), &docs.join("src"))?;
    if !broken.is_empty() {
        bail!("dead links in the sources:\n  {}", broken.join("\n  "));
    }

    let chapters = chapters(&std::fs::read_to_string(docs.join("src/SUMMARY.md"))?);
    for (_, path) in &chapters {
        let page = out_dir.join(Path::new(path).with_extension("html"));
        if !page.is_file() {
            bail!("chapter {path} has no page at {}", page.display());
        }
    }
    let links_checked = check_links(&out_dir)?;

    let screenshot = if args.browser {
        Some(browser_check(&out_dir, &chapters)?)
    } else {
        None
    };
    Ok(BookReport {
        out_dir,
        chapters: chapters.len(),
        links_checked,
        screenshot,
    })
}

/// The HTML folder `book.toml`'s `build-dir` names (mdBook's default is `book/`).
fn out_dir(docs: &Path) -> Result<PathBuf> {
    let config = std::fs::read_to_string(docs.join("book.toml"))?;
    let build_dir = config
        .lines()
        .filter_map(|line| line.trim().strip_prefix("build-dir"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .map(|value| value.trim().trim_matches('"').to_string())
        .next()
        .unwrap_or_else(|| "book".into());
    let dir = docs.join(build_dir);
    Ok(dir.canonicalize().unwrap_or(dir))
}

/// `(title, path)` of every chapter linked from `SUMMARY.md`, in order.
fn chapters(summary: &str) -> Vec<(String, String)> {
    summary
        .lines()
        .filter_map(|line| {
            let open = line.find('[')?;
            let close = open + line[open..].find("](")?;
            let end = close + line[close..].find(')')?;
            let path = &line[close + 2..end];
            path.ends_with(".md")
                .then(|| (line[open + 1..close].to_string(), path.to_string()))
        })
        .collect()
}

/// Follows every relative `href` in the built pages (mdBook turns links between `.md` files
/// into `.html` ones) and fails on the first that points at no file. Returns how many it
/// followed.
fn check_links(out_dir: &Path) -> Result<usize> {
    let mut checked = 0;
    let mut broken = BTreeSet::new();
    let mut pages = Vec::new();
    files_with_extension(out_dir, "html", &mut pages)?;
    for page in pages {
        let html = std::fs::read_to_string(&page)?;
        for target in hrefs(&html) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            if file.is_empty() {
                continue;
            }
            checked += 1;
            let resolved = page.parent().unwrap_or(out_dir).join(file);
            if !resolved.exists() {
                broken.insert(format!(
                    "{} -> {target}",
                    page.strip_prefix(out_dir).unwrap_or(&page).display()
                ));
            }
        }
    }
    if !broken.is_empty() {
        bail!(
            "{} broken links in the book:\n  {}",
            broken.len(),
            broken.into_iter().collect::<Vec<_>>().join("\n  ")
        );
    }
    Ok(checked)
}

/// The files under `dir` whose extension is `extension`, skipping mdBook's own asset folders
/// (fonts, highlight.js), which hold no links of ours.
fn files_with_extension(dir: &Path, extension: &str, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if !matches!(
                path.file_name().and_then(|n| n.to_str()),
                Some("css" | "fonts" | "FontAwesome")
            ) {
                files_with_extension(&path, extension, files)?;
            }
        } else if path.extension().is_some_and(|e| e == extension) {
            files.push(path);
        }
    }
    Ok(())
}

fn hrefs(html: &str) -> impl Iterator<Item = &str> {
    html.split("href=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
}

/// Loads the first page in headless Chromium, checks that its table of contents lists every
/// chapter, and saves a screenshot beside the book.
fn browser_check(out_dir: &Path, chapters: &[(String, String)]) -> Result<PathBuf> {
    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| Command::new(name).arg("--version").output().is_ok())
        .context("no Chromium found: on Debian, `apt-get install chromium`")?;
    let index = format!("file://{}", out_dir.join("index.html").display());
    let headless = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ];
    let dom = Command::new(browser)
        .args(headless)
        .args(["--virtual-time-budget=5000", "--dump-dom", &index])
        .output()
        .context("could not run the browser")?;
    let dom = String::from_utf8_lossy(&dom.stdout);
    let missing: Vec<_> = chapters
        .iter()
        .filter(|(title, _)| !dom.contains(&escape(title)))
        .map(|(title, _)| title.as_str())
        .collect();
    if !missing.is_empty() {
        bail!(
            "the browser's table of contents lacks {} chapters: {}",
            missing.len(),
            missing.join(", ")
        );
    }
    let screenshot = out_dir.join("screenshot.png");
    let status = Command::new(browser)
        .args(headless)
        .arg(format!("--screenshot={}", screenshot.display()))
        .args([
            "--window-size=1280,900",
            "--virtual-time-budget=5000",
            &index,
        ])
        .output()
        .context("could not run the browser")?
        .status;
    if !status.success() || !screenshot.is_file() {
        bail!("the browser made no screenshot ({status})");
    }
    eprintln!("{browser}: the table of contents lists every chapter");
    Ok(screenshot)
}

/// A chapter title as the browser serialises text (quotes stay as they are).
fn escape(title: &str) -> String {
    title
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// [`broken_source_links`] of the README and of every page under `src`.
fn broken_links_in_sources(readme: &Path, src: &Path) -> Result<Vec<String>> {
    let mut files = vec![readme.to_path_buf()];
    files_with_extension(src, "md", &mut files)?;
    let mut broken = Vec::new();
    for file in files {
        broken.extend(broken_source_links(&file)?);
    }
    Ok(broken)
}

/// Relative links to Markdown files in `file` (a page of the book or the README) that point at
/// no file: what `mdbook build` would turn into dead links. Checked by a test, so that CI holds
/// the book's links without installing mdBook.
fn broken_source_links(file: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(file)?;
    let dir = file.parent().unwrap_or(Path::new("."));
    Ok(text
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.contains("://") && !target.starts_with('#'))
        .map(|target| target.split('#').next().unwrap_or_default())
        .filter(|target| target.ends_with(".md") && !dir.join(target).is_file())
        .map(|target| format!("{} -> {target}", file.display()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chapter_has_a_written_page_and_no_link_is_dead() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let src = root.join("docs/src");
        let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
        let chapters = chapters(&summary);
        assert!(chapters.len() >= 20, "{} chapters", chapters.len());
        for (title, path) in &chapters {
            let page = src.join(path);
            let mut text = std::fs::read_to_string(&page)
                .unwrap_or_else(|e| panic!("chapter {title:?} ({path}): {e}"));
            // A page that is one `{{#include FILE}}` (the changelog) is that file.
            if let Some(included) = text
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|rest| rest.strip_suffix("}}"))
            {
                text = std::fs::read_to_string(page.parent().unwrap().join(included)).unwrap();
            }
            assert!(
                text.trim().len() > 200,
                "chapter {title:?} ({path}) is not written"
            );
        }
        let broken = broken_links_in_sources(&root.join("README.md"), &src).unwrap();
        assert!(broken.is_empty(), "dead links:\n{}", broken.join("\n"));
    }

    #[test]
    fn chapters_are_read_from_the_summary_in_order() {
        let summary = "# Summary\n\n[Intro](introduction.md)\n\n# Part\n\n- [A page](a/page.md)\n  - [Nested](a/nested.md)\n- [Draft]()\n";
        assert_eq!(
            chapters(summary),
            vec![
                ("Intro".to_string(), "introduction.md".to_string()),
                ("A page".to_string(), "a/page.md".to_string()),
                ("Nested".to_string(), "a/nested.md".to_string()),
            ]
        );
    }

    #[test]
    fn a_link_to_a_missing_page_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(
            dir.path().join("index.html"),
            r#"<a href="sub/page.html#x">ok</a> <a href="https://burn.dev">out</a>"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("sub/page.html"),
            r#"<a href="../index.html">up</a> <a href="gone.html">broken</a>"#,
        )
        .unwrap();
        let err = check_links(dir.path()).unwrap_err().to_string();
        assert!(err.contains("sub/page.html -> gone.html"), "{err}");
        assert!(!err.contains("index.html ->"), "{err}");
        std::fs::write(dir.path().join("sub/gone.html"), "").unwrap();
        assert_eq!(check_links(dir.path()).unwrap(), 3);
    }
}

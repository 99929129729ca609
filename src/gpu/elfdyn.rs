//! What an ELF shared object or executable says to the dynamic loader: its SONAME, the libraries
//! it needs, its run path and the functions it exports.
//!
//! Shared by `build.rs` (which reads the CUDA libraries the link will use, to generate one lazy
//! trampoline per exported function: see `lazy.rs`), the lib's unit tests and `tests/no_cuda.rs`
//! (which checks that the built binary needs no CUDA library). It only reads the section headers,
//! `.dynamic`, `.dynsym` and their string tables through a read cache, so the 500 MB libcublasLt
//! is not read whole.

use std::fs::File;
use std::path::Path;

use object::elf::{self, FileHeader64};
use object::read::elf::{Dyn, FileHeader, SectionHeader, Sym};
use object::{Endianness, ReadCache, ReadRef};

/// The dynamic-linking view of one ELF file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ElfDyn {
    /// `DT_SONAME`: the name other objects record in `DT_NEEDED` and the loader looks for.
    pub soname: Option<String>,
    /// `DT_NEEDED` entries, in order.
    pub needed: Vec<String>,
    /// `DT_RUNPATH` and `DT_RPATH` strings, each with the file offset of its first byte.
    pub run_paths: Vec<(String, u64)>,
    /// Functions the file exports: defined, global or weak, default visibility, in `.dynsym`
    /// order. Symbol versions are not part of the name.
    pub functions: Vec<String>,
}

/// Reads `path` (a 64-bit ELF file).
pub fn read(path: &Path) -> Result<ElfDyn, String> {
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cache = ReadCache::new(file);
    parse(&cache).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse<'data, R: ReadRef<'data>>(data: R) -> Result<ElfDyn, String> {
    let text = |e: object::read::Error| e.to_string();
    let header = FileHeader64::<Endianness>::parse(data).map_err(text)?;
    let endian = header.endian().map_err(text)?;
    let sections = header.sections(endian, data).map_err(text)?;
    let mut out = ElfDyn::default();
    if let Some((entries, strtab_index)) = sections.dynamic(endian, data).map_err(text)? {
        let strings = sections.strings(endian, data, strtab_index).map_err(text)?;
        let strtab_offset = sections.section(strtab_index).map_err(text)?.sh_offset(endian);
        for entry in entries {
            let tag = entry.d_tag(endian);
            if tag == elf::DT_NULL {
                break;
            }
            let val = entry.d_val(endian);
            let string = || -> Result<String, String> {
                let bytes = u32::try_from(val).ok().and_then(|v| strings.get(v).ok());
                let bytes = bytes.ok_or_else(|| format!("bad string offset {val} in .dynamic"))?;
                Ok(String::from_utf8_lossy(bytes).into_owned())
            };
            match tag {
                elf::DT_SONAME => out.soname = Some(string()?),
                elf::DT_NEEDED => out.needed.push(string()?),
                elf::DT_RUNPATH | elf::DT_RPATH => {
                    out.run_paths.push((string()?, strtab_offset + val));
                }
                _ => {}
            }
        }
    }
    let symbols = sections.symbols(endian, data, elf::SHT_DYNSYM).map_err(text)?;
    for sym in symbols.iter() {
        let exported = matches!(sym.st_bind(), elf::STB_GLOBAL | elf::STB_WEAK)
            && matches!(sym.st_type(), elf::STT_FUNC | elf::STT_GNU_IFUNC)
            && sym.st_visibility() == elf::STV_DEFAULT
            && !sym.is_undefined(endian);
        if exported {
            let name = sym.name(endian, symbols.strings()).map_err(text)?;
            out.functions.push(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(out)
}

//! The part of Python's pickle protocol that `torch.save` writes, read far enough to list a
//! checkpoint's tensors with everything needed to check them: storage, element offset, shape
//! and strides.
//!
//! burn-store's reader turns each tensor into a loader as it parses and drops the storage offset
//! checks and the strides on the way, so a damaged file cannot be told from a good one after
//! it has run. This reader keeps them. Objects live in an arena and refer to each other by
//! index: a memo lookup copies an index, not an object (a small file cannot expand into a huge
//! one by re-using a memoised list), cycles are harmless, and nothing is dropped recursively.

use std::collections::HashMap;

/// One tensor as the pickle describes it; its bytes live in the storage named `storage`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TensorEntry {
    /// The storage's key: the data file's name in the archive (`data/<key>`).
    pub storage: String,
    /// PyTorch's storage class, e.g. `FloatStorage`.
    pub storage_type: String,
    /// Elements in the whole storage, as the persistent id declares them.
    pub storage_numel: u64,
    /// The tensor's first element, in elements from the storage's start.
    pub offset: u64,
    pub shape: Vec<u64>,
    /// Elements to step in the storage per index of each dimension.
    pub stride: Vec<u64>,
}

/// A Python object, as far as a state dict needs one.
#[derive(Clone, Debug)]
enum Node {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits, as little-endian two's-complement bytes.
    BigInt(Vec<u8>),
    Str(String),
    Tuple(Vec<usize>),
    List(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Global {
        module: String,
        name: String,
    },
    Storage(StorageRef),
    Tensor(TensorEntry),
    /// Anything else (an optimizer's state, a user's object): kept, never looked into.
    Opaque,
}

#[derive(Clone, Debug)]
struct StorageRef {
    key: String,
    storage_type: String,
    numel: u64,
    /// A legacy (pre-1.6) view: elements from the start of the root storage.
    view_offset: u64,
}

/// Why a pickle could not be read.
pub(crate) type PickleError = String;

/// The arena and the virtual machine's stacks.
pub(crate) struct Unpickler<'a> {
    data: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<usize>,
    marks: Vec<usize>,
    memo: HashMap<u64, usize>,
}

/// Nested dicts deeper than this are not state dicts; the limit bounds the walk.
const MAX_DEPTH: usize = 32;

/// The first object of a legacy (pre-1.6) `torch.save` file: this magic number.
const LEGACY_MAGIC: [u8; 10] = [0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19];

impl<'a> Unpickler<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            pos: 0,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    /// Bytes not yet read: in a legacy file, the storages follow the pickles.
    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.data[self.pos..]
    }

    /// Reads one pickle (up to its STOP) and returns the tensors it holds, keyed by their
    /// dotted path through nested dicts (`"fc.S1s"`; a checkpoint `{"model": sd}` gives
    /// `"model.fc.S1s"`).
    pub(crate) fn tensors(&mut self) -> Result<Vec<(String, TensorEntry)>, PickleError> {
        let root = self.load()?;
        let mut out = Vec::new();
        let mut seen = vec![false; self.nodes.len()];
        self.collect(root, String::new(), 0, &mut seen, &mut out);
        Ok(out)
    }

    /// Reads the legacy format's three header pickles (magic number, protocol version,
    /// system info) and checks them.
    pub(crate) fn legacy_header(&mut self) -> Result<(), PickleError> {
        let magic = self.load()?;
        if !matches!(&self.nodes[magic], Node::BigInt(bytes) if bytes[..] == LEGACY_MAGIC) {
            return Err("not a torch.save file: the legacy magic number is missing".into());
        }
        let _protocol = self.load()?;
        let info = self.load()?;
        if let Node::Dict(items) = &self.nodes[info] {
            for &(key, value) in items {
                if matches!(&self.nodes[key], Node::Str(k) if k == "little_endian")
                    && matches!(self.nodes[value], Node::Bool(false))
                {
                    return Err("big-endian legacy checkpoints are not supported".into());
                }
            }
        }
        Ok(())
    }

    /// Reads a pickle that is a list of strings (a legacy file's storage keys, in data order).
    pub(crate) fn strings(&mut self) -> Result<Vec<String>, PickleError> {
        let root = self.load()?;
        let Node::List(items) = &self.nodes[root] else {
            return Err("expected the list of storage keys".into());
        };
        items
            .iter()
            .map(|&item| match &self.nodes[item] {
                Node::Str(s) => Ok(s.clone()),
                _ => Err("a storage key is not a string".into()),
            })
            .collect()
    }

    fn collect(
        &self,
        node: usize,
        path: String,
        depth: usize,
        seen: &mut [bool],
        out: &mut Vec<(String, TensorEntry)>,
    ) {
        match &self.nodes[node] {
            Node::Tensor(entry) => out.push((path, entry.clone())),
            // Each dict is walked once: a dict that holds itself is not a state dict.
            Node::Dict(items) if depth < MAX_DEPTH && !std::mem::replace(&mut seen[node], true) => {
                for &(key, value) in items {
                    let name = match &self.nodes[key] {
                        Node::Str(s) => s.clone(),
                        Node::Int(i) => i.to_string(),
                        _ => continue,
                    };
                    let path = if path.is_empty() {
                        name
                    } else {
                        format!("{path}.{name}")
                    };
                    self.collect(value, path, depth + 1, seen, out);
                }
            }
            _ => {}
        }
    }

    fn push(&mut self, node: Node) {
        self.nodes.push(node);
        self.stack.push(self.nodes.len() - 1);
    }

    fn pop(&mut self) -> Result<usize, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err("stack underflow".into());
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&self) -> Result<usize, PickleError> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| "empty stack".into())
    }

    fn pop_mark(&mut self) -> Result<Vec<usize>, PickleError> {
        let mark = self.marks.pop().ok_or("no mark")?;
        Ok(self.stack.split_off(mark))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or("pickle ends early")?;
        let bytes = &self.data[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("unterminated line")?;
        let line = String::from_utf8(rest[..end].to_vec()).map_err(|_| "line is not UTF-8")?;
        self.pos += end + 1;
        Ok(line)
    }

    fn text(&mut self, len: usize) -> Result<(), PickleError> {
        let bytes = self.take(len)?;
        let s = String::from_utf8(bytes.to_vec()).map_err(|_| "string is not UTF-8")?;
        self.push(Node::Str(s));
        Ok(())
    }

    fn long(&mut self, len: usize) -> Result<(), PickleError> {
        let bytes = self.take(len)?;
        if len <= 8 {
            let mut value: i64 = 0;
            for (i, &b) in bytes.iter().enumerate() {
                value |= i64::from(b) << (8 * i);
            }
            if len > 0 && len < 8 && bytes[len - 1] & 0x80 != 0 {
                value |= -1i64 << (8 * len);
            }
            self.push(Node::Int(value));
        } else {
            self.push(Node::BigInt(bytes.to_vec()));
        }
        Ok(())
    }

    fn memo_put(&mut self, index: u64) -> Result<(), PickleError> {
        let top = self.top()?;
        self.memo.insert(index, top);
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Result<(), PickleError> {
        let node = *self.memo.get(&index).ok_or("memo entry not found")?;
        self.stack.push(node);
        Ok(())
    }

    fn set_items(&mut self, items: Vec<usize>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err("odd number of dict items".into());
        }
        let dict = self.top()?;
        let pairs = items.chunks_exact(2).map(|kv| (kv[0], kv[1]));
        match &mut self.nodes[dict] {
            Node::Dict(entries) => entries.extend(pairs),
            Node::Opaque => {}
            _ => return Err("setting items on a non-dict".into()),
        }
        Ok(())
    }

    fn append(&mut self, items: Vec<usize>) -> Result<(), PickleError> {
        let list = self.top()?;
        match &mut self.nodes[list] {
            Node::List(entries) => entries.extend(items),
            Node::Opaque => {}
            _ => return Err("appending to a non-list".into()),
        }
        Ok(())
    }

    /// Runs the machine to the next STOP and returns the object it built.
    fn load(&mut self) -> Result<usize, PickleError> {
        // Each pickle in a file has its own memo, as each `pickle.load` call in Python does.
        self.stack.clear();
        self.marks.clear();
        self.memo.clear();
        loop {
            let op = self.u8()?;
            match op {
                b'.' => return self.pop(),
                0x80 => {
                    let protocol = self.u8()?;
                    if protocol > 5 {
                        return Err(format!("pickle protocol {protocol} is not supported"));
                    }
                }
                0x95 => {
                    self.take(8)?;
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    self.pop()?;
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                b'N' => self.push(Node::None),
                0x88 => self.push(Node::Bool(true)),
                0x89 => self.push(Node::Bool(false)),
                b'J' => {
                    let value = i32::from_le_bytes(self.le()?);
                    self.push(Node::Int(value.into()));
                }
                b'K' => {
                    let value = self.u8()?;
                    self.push(Node::Int(value.into()));
                }
                b'M' => {
                    let value = u16::from_le_bytes(self.le()?);
                    self.push(Node::Int(value.into()));
                }
                b'I' | b'L' => {
                    let line = self.line()?;
                    let digits = line.trim_end_matches('L');
                    let node = match digits {
                        "00" => Node::Bool(false),
                        "01" => Node::Bool(true),
                        _ => Node::Int(digits.parse().map_err(|_| "bad INT literal")?),
                    };
                    self.push(node);
                }
                0x8a => {
                    let len = self.u8()? as usize;
                    self.long(len)?;
                }
                0x8b => {
                    let len = u32::from_le_bytes(self.le()?) as usize;
                    self.long(len)?;
                }
                b'G' => {
                    self.take(8)?;
                    self.push(Node::Opaque);
                }
                b'X' => {
                    let len = u32::from_le_bytes(self.le()?) as usize;
                    self.text(len)?;
                }
                0x8c => {
                    let len = self.u8()? as usize;
                    self.text(len)?;
                }
                0x8d => {
                    let len = u64::from_le_bytes(self.le()?);
                    self.text(usize::try_from(len).map_err(|_| "string too long")?)?;
                }
                // Byte strings: `torch.save` writes none a state dict needs; skip their bytes.
                b'U' | b'C' => {
                    let len = self.u8()? as usize;
                    self.take(len)?;
                    self.push(Node::Opaque);
                }
                b'T' | b'B' => {
                    let len = u32::from_le_bytes(self.le()?) as usize;
                    self.take(len)?;
                    self.push(Node::Opaque);
                }
                0x8e => {
                    let len = u64::from_le_bytes(self.le()?);
                    self.take(usize::try_from(len).map_err(|_| "bytes too long")?)?;
                    self.push(Node::Opaque);
                }
                b')' => self.push(Node::Tuple(Vec::new())),
                b']' => self.push(Node::List(Vec::new())),
                b'}' => self.push(Node::Dict(Vec::new())),
                0x8f => self.push(Node::Opaque),
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Tuple(items));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push(Node::Tuple(items));
                }
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Node::List(items));
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    self.push(Node::Dict(Vec::new()));
                    self.set_items(items)?;
                }
                0x90 => {
                    self.pop_mark()?;
                }
                0x91 => {
                    self.pop_mark()?;
                    self.push(Node::Opaque);
                }
                b'a' => {
                    let item = self.pop()?;
                    self.append(vec![item])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.set_items(vec![key, value])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                b'q' => {
                    let index = self.u8()?;
                    self.memo_put(index.into())?;
                }
                b'r' => {
                    let index = u32::from_le_bytes(self.le()?);
                    self.memo_put(index.into())?;
                }
                0x94 => {
                    let index = self.memo.len() as u64;
                    self.memo_put(index)?;
                }
                b'p' => {
                    let index = self.line()?.parse().map_err(|_| "bad PUT index")?;
                    self.memo_put(index)?;
                }
                b'h' => {
                    let index = self.u8()?;
                    self.memo_get(index.into())?;
                }
                b'j' => {
                    let index = u32::from_le_bytes(self.le()?);
                    self.memo_get(index.into())?;
                }
                b'g' => {
                    let index = self.line()?.parse().map_err(|_| "bad GET index")?;
                    self.memo_get(index)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.push(Node::Global { module, name });
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (&self.nodes[module], &self.nodes[name]) {
                        (Node::Str(module), Node::Str(name)) => {
                            let node = Node::Global {
                                module: module.clone(),
                                name: name.clone(),
                            };
                            self.push(node);
                        }
                        _ => return Err("STACK_GLOBAL needs two strings".into()),
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = self.storage(pid)?;
                    self.push(Node::Storage(storage));
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let node = self.reduce(callable, args, 0)?;
                    self.push(node);
                }
                0x81 => {
                    self.pop()?;
                    self.pop()?;
                    self.push(Node::Opaque);
                }
                0x92 => {
                    self.pop()?;
                    self.pop()?;
                    self.pop()?;
                    self.push(Node::Opaque);
                }
                b'b' => {
                    let state = self.pop()?;
                    let object = self.top()?;
                    if let (Node::Dict(update), Node::Dict(_)) =
                        (&self.nodes[state], &self.nodes[object])
                    {
                        let update = update.clone();
                        if let Node::Dict(entries) = &mut self.nodes[object] {
                            entries.extend(update);
                        }
                    }
                }
                other => return Err(format!("unsupported pickle opcode 0x{other:02x}")),
            }
        }
    }

    fn items(&self, node: usize) -> Option<&[usize]> {
        match &self.nodes[node] {
            Node::Tuple(items) | Node::List(items) => Some(items),
            _ => None,
        }
    }

    fn int(&self, node: usize, what: &str) -> Result<u64, PickleError> {
        match self.nodes[node] {
            Node::Int(value) => {
                u64::try_from(value).map_err(|_| format!("{what} is negative ({value})"))
            }
            _ => Err(format!("{what} is not an integer")),
        }
    }

    fn ints(&self, node: usize, what: &str) -> Result<Vec<u64>, PickleError> {
        self.items(node)
            .ok_or_else(|| format!("{what} is not a tuple"))?
            .iter()
            .map(|&item| self.int(item, what))
            .collect()
    }

    /// PyTorch's persistent id of a storage: `('storage', StorageType, key, location, numel)`,
    /// with a sixth item, the view of a root storage, in legacy files.
    fn storage(&self, pid: usize) -> Result<StorageRef, PickleError> {
        let items = self.items(pid).ok_or("persistent id is not a tuple")?;
        if items.len() < 5 || !matches!(&self.nodes[items[0]], Node::Str(s) if s == "storage") {
            return Err("persistent id is not a PyTorch storage".into());
        }
        let storage_type = match &self.nodes[items[1]] {
            Node::Global { name, .. } | Node::Str(name) => name.clone(),
            _ => return Err("storage type is not a class".into()),
        };
        let key = match &self.nodes[items[2]] {
            Node::Str(key) => key.clone(),
            _ => return Err("storage key is not a string".into()),
        };
        let numel = self.int(items[4], "storage size")?;
        let view_offset = match items.get(5).map(|&view| &self.nodes[view]) {
            None | Some(Node::None) => 0,
            Some(Node::Tuple(view)) if view.len() >= 2 => self.int(view[1], "view offset")?,
            Some(_) => return Err("storage view is not (key, offset, size)".into()),
        };
        Ok(StorageRef {
            key,
            storage_type,
            numel,
            view_offset,
        })
    }

    /// Calls the few functions a state dict's tensors are rebuilt with; anything else
    /// becomes an opaque object.
    fn reduce(&self, callable: usize, args: usize, depth: usize) -> Result<Node, PickleError> {
        let Node::Global { module, name } = &self.nodes[callable] else {
            return Ok(Node::Opaque);
        };
        if depth > MAX_DEPTH {
            return Err(format!("{name} nested more than {MAX_DEPTH} deep"));
        }
        let args_list = self.items(args).unwrap_or(&[]);
        match (module.as_str(), name.as_str()) {
            ("collections", "OrderedDict") => {
                let mut entries = Vec::new();
                if let Some(&pairs) = args_list.first()
                    && let Some(pairs) = self.items(pairs)
                {
                    for &pair in pairs {
                        if let Some(&[key, value]) = self.items(pair) {
                            entries.push((key, value));
                        }
                    }
                }
                Ok(Node::Dict(entries))
            }
            ("torch._utils", "_rebuild_tensor" | "_rebuild_tensor_v2") => {
                let [storage, offset, shape, stride, ..] = args_list else {
                    return Err(format!("{name} needs at least 4 arguments"));
                };
                let Node::Storage(storage) = &self.nodes[*storage] else {
                    return Err(format!("{name}: the first argument is not a storage"));
                };
                let shape = self.ints(*shape, "shape")?;
                let stride = self.ints(*stride, "stride")?;
                if shape.len() != stride.len() {
                    return Err(format!(
                        "shape {shape:?} and stride {stride:?} differ in length"
                    ));
                }
                let offset = self
                    .int(*offset, "storage offset")?
                    .checked_add(storage.view_offset)
                    .ok_or("storage offset overflows")?;
                Ok(Node::Tensor(TensorEntry {
                    storage: storage.key.clone(),
                    storage_type: storage.storage_type.clone(),
                    storage_numel: storage.numel,
                    offset,
                    shape,
                    stride,
                }))
            }
            ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => {
                match args_list.first() {
                    Some(&data) => Ok(self.nodes[data].clone()),
                    None => Err(format!("{name} without arguments")),
                }
            }
            ("torch._tensor", "_rebuild_from_type_v2") => {
                let [function, _type, inner_args, ..] = args_list else {
                    return Err(format!("{name} needs at least 3 arguments"));
                };
                self.reduce(*function, *inner_args, depth + 1)
            }
            _ => Ok(Node::Opaque),
        }
    }
}

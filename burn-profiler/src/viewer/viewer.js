// burn-memory's profile viewer: draws the embedded profile on canvases, with no library.
//
// Scaling: the heap blocks are swept once in time order, bucketed by pixel column. The
// MAX_DRAWN largest blocks are drawn one by one as stacked polygons whose steps (a block
// below freed) are kept at most once per pixel column; every other block is summed per colour
// group and per column, and drawn as one band per group. Lines are decimated to the first,
// lowest, highest and last value of each pixel column. So the drawing costs
// O(events + MAX_DRAWN * steps + groups * width), whatever the number of blocks.
(function () {
  'use strict';

  const MAX_DRAWN = 2000;
  const PALETTE = [
    '#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b',
    '#e377c2', '#17becf', '#bcbd22', '#3f5d7d', '#ad494a', '#637939',
  ];
  const OTHER = '#9aa3ad';
  const UNSCOPED = '#c3cad2';
  const MARGIN = { left: 74, right: 16, top: 18, bottom: 30 };
  const FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif';

  const started = performance.now();
  const data = JSON.parse(document.getElementById('profile-data').textContent);
  const status = {
    ready: false, mode: '', blocks: 0, drawnBlocks: 0, rows: 0, ops: 0,
    peakBytes: 0, peakNs: 0, renderMs: 0, scriptMs: 0, drawMs: 0, drawnPixels: 0, error: null,
  };
  window.__viewer = status;

  // ---- formatting -------------------------------------------------------------------------

  function fmtBytes(bytes) {
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let value = bytes;
    let unit = 0;
    while (Math.abs(value) >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    const digits = unit === 0 || Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
    return value.toFixed(digits) + ' ' + units[unit];
  }

  function fmtTime(ns) {
    if (ns < 1e3) return Math.round(ns) + ' ns';
    if (ns < 1e6) return (ns / 1e3).toFixed(ns < 1e4 ? 2 : 1) + ' µs';
    if (ns < 1e9) return (ns / 1e6).toFixed(ns < 1e7 ? 2 : 1) + ' ms';
    return (ns / 1e9).toFixed(2) + ' s';
  }

  function escapeHtml(text) {
    return String(text).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));
  }

  // A step of 1, 2 or 5 times a power of `base` giving about `count` ticks up to `max`.
  function niceStep(max, count, base) {
    if (!(max > 0)) return 1;
    const raw = max / count;
    const power = Math.pow(base, Math.floor(Math.log(raw) / Math.log(base)));
    for (const m of [1, 2, 5, 10, 20, 50, 100, 200, 500]) {
      if (power * m >= raw) return power * m;
    }
    return power * 1000;
  }

  // ---- data ---------------------------------------------------------------------------------

  const scopeNames = data.scope_names;
  const opNames = data.op_names;
  const ops = data.ops;
  const blocks = data.blocks;
  const nOps = ops.name.length;
  const nBlocks = blocks.size.length;
  const endNs = Math.max(1, data.end_ns);
  status.blocks = nBlocks;
  status.ops = nOps;

  // Memory counters after each op: time (op end), in use, reserved.
  const counters = { t: [], inUse: [], reserved: [], op: [] };
  for (let i = 0; i < nOps; i++) {
    if (ops.in_use[i] < 0) continue;
    counters.t.push(ops.start_ns[i] + ops.time_ns[i]);
    counters.inUse.push(ops.in_use[i]);
    counters.reserved.push(ops.reserved[i]);
    counters.op.push(i);
  }
  let counterPeak = -1;
  for (let i = 0; i < counters.inUse.length; i++) {
    if (counterPeak < 0 || counters.inUse[i] > counters.inUse[counterPeak]) counterPeak = i;
  }

  function opLabel(index) {
    return index < 0 ? '(no operation)' : opNames[index];
  }
  function scopeLabel(index) {
    return index < 0 ? '(no scope)' : scopeNames[index];
  }

  // ---- canvas helpers -----------------------------------------------------------------------

  function setup(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const rect = canvas.getBoundingClientRect();
    const width = Math.max(320, Math.round(rect.width || canvas.width));
    const height = Math.max(120, Math.round(rect.height || canvas.height));
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.fillStyle = '#ffffff';
    ctx.fillRect(0, 0, width, height);
    ctx.font = FONT;
    const plot = {
      x: MARGIN.left,
      y: MARGIN.top,
      w: width - MARGIN.left - MARGIN.right,
      h: height - MARGIN.top - MARGIN.bottom,
    };
    return { ctx, width, height, plot };
  }

  // Grid, byte ticks on the left and time ticks below.
  function axes(view, maxBytes) {
    const { ctx, plot } = view;
    ctx.save();
    ctx.strokeStyle = '#e3e7ec';
    ctx.fillStyle = '#5d6773';
    ctx.lineWidth = 1;
    ctx.textAlign = 'right';
    ctx.textBaseline = 'middle';
    const labelCount = Math.max(2, Math.floor(plot.h / 40));
    // Labels in one unit (the largest that fits the top), at 1, 2 or 5 times a power of 10.
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let unit = 0;
    while (unit < units.length - 1 && maxBytes / Math.pow(1024, unit + 1) >= 1) unit++;
    const scale = Math.pow(1024, unit);
    const byteStep = niceStep(maxBytes / scale, labelCount, 10);
    const decimals = byteStep >= 1 ? 0 : byteStep >= 0.1 ? 1 : 2;
    for (let i = 0; i * byteStep * scale <= maxBytes + 1e-9; i++) {
      const b = i * byteStep * scale;
      const y = Math.round(plot.y + plot.h - (b / maxBytes) * plot.h) + 0.5;
      ctx.beginPath();
      ctx.moveTo(plot.x, y);
      ctx.lineTo(plot.x + plot.w, y);
      ctx.stroke();
      const label = i === 0 ? '0' : (i * byteStep).toFixed(decimals) + ' ' + units[unit];
      ctx.fillText(label, plot.x - 6, y);
    }
    ctx.textAlign = 'center';
    ctx.textBaseline = 'top';
    const timeCount = Math.max(2, Math.floor(plot.w / 110));
    const timeStep = niceStep(endNs, timeCount, 10);
    for (let i = 0, t = 0; t <= endNs + 1e-9; i++, t = i * timeStep) {
      const x = Math.round(plot.x + (t / endNs) * plot.w) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, plot.y + plot.h);
      ctx.lineTo(x, plot.y + plot.h + 4);
      ctx.stroke();
      const label = t === 0 ? '0' : fmtTime(t);
      const width = ctx.measureText(label).width;
      const clamped = Math.min(Math.max(x, plot.x + width / 2), plot.x + plot.w - width / 2);
      ctx.fillText(label, clamped, plot.y + plot.h + 7);
    }
    ctx.strokeStyle = '#9aa3ad';
    ctx.beginPath();
    ctx.moveTo(plot.x + 0.5, plot.y);
    ctx.lineTo(plot.x + 0.5, plot.y + plot.h + 0.5);
    ctx.lineTo(plot.x + plot.w, plot.y + plot.h + 0.5);
    ctx.stroke();
    ctx.restore();
  }

  // A marker and label at the peak, kept inside the plot.
  function markPeak(view, x, y, text) {
    const { ctx, plot } = view;
    ctx.save();
    ctx.strokeStyle = '#c62828';
    ctx.fillStyle = '#c62828';
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    ctx.moveTo(plot.x, Math.round(y) + 0.5);
    ctx.lineTo(plot.x + plot.w, Math.round(y) + 0.5);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.beginPath();
    ctx.arc(x, y, 4, 0, Math.PI * 2);
    ctx.fill();
    ctx.font = 'bold ' + FONT;
    const width = ctx.measureText(text).width;
    let lx = x + 8;
    if (lx + width > plot.x + plot.w - 4) lx = x - 8 - width;
    lx = Math.max(plot.x + 4, lx);
    const ly = y - 10 < plot.y + 8 ? y + 14 : y - 10;
    ctx.fillStyle = 'rgba(255,255,255,0.85)';
    ctx.fillRect(lx - 3, ly - 8, width + 6, 16);
    ctx.fillStyle = '#c62828';
    ctx.textBaseline = 'middle';
    ctx.fillText(text, lx, ly);
    ctx.restore();
  }

  function message(view, text) {
    const { ctx, plot } = view;
    ctx.save();
    ctx.fillStyle = '#5d6773';
    ctx.textAlign = 'center';
    ctx.textBaseline = 'middle';
    ctx.fillText(text, plot.x + plot.w / 2, plot.y + plot.h / 2);
    ctx.restore();
  }

  // Decimated line: first, lowest, highest and last value of each pixel column.
  function decimatedLine(view, times, values, maxBytes, colour, width) {
    const { ctx, plot } = view;
    const n = times.length;
    if (n === 0) return;
    const xOf = (t) => plot.x + (t / endNs) * plot.w;
    const yOf = (v) => plot.y + plot.h - (v / maxBytes) * plot.h;
    ctx.save();
    ctx.strokeStyle = colour;
    ctx.lineWidth = width;
    ctx.lineJoin = 'round';
    ctx.beginPath();
    let i = 0;
    let first = true;
    while (i < n) {
      const column = Math.floor(xOf(times[i]));
      let lo = values[i];
      let hi = values[i];
      const start = values[i];
      let j = i + 1;
      while (j < n && Math.floor(xOf(times[j])) === column) {
        if (values[j] < lo) lo = values[j];
        if (values[j] > hi) hi = values[j];
        j++;
      }
      const last = values[j - 1];
      const x = xOf(times[i]);
      if (first) {
        ctx.moveTo(x, yOf(start));
        first = false;
      } else {
        ctx.lineTo(x, yOf(start));
      }
      if (j - i > 1) {
        ctx.lineTo(x, yOf(lo));
        ctx.lineTo(x, yOf(hi));
        ctx.lineTo(x, yOf(last));
      }
      i = j;
    }
    ctx.lineTo(plot.x + plot.w, yOf(values[n - 1]));
    ctx.stroke();
    ctx.restore();
  }

  // ---- the block timeline -------------------------------------------------------------------

  let layout = null; // what hover reads

  function buildGroups(colourBy) {
    const keys = colourBy === 'op' ? blocks.op : blocks.scope;
    const names = colourBy === 'op' ? opLabel : scopeLabel;
    const bytes = new Map();
    for (let i = 0; i < nBlocks; i++) {
      bytes.set(keys[i], (bytes.get(keys[i]) || 0) + blocks.size[i]);
    }
    const ordered = [...bytes.entries()].sort((a, b) => b[1] - a[1]);
    const groupOf = new Map();
    const groups = [];
    let colours = 0;
    ordered.forEach(([key], index) => {
      if (ordered.length <= PALETTE.length || index < PALETTE.length - 1) {
        groupOf.set(key, groups.length);
        // Memory outside any scope (or operation) in a neutral grey, so scoped work stands out.
        const colour = key < 0 ? UNSCOPED : PALETTE[colours++];
        groups.push({ name: names(key), colour });
      }
    });
    if (ordered.length > groups.length) {
      const other = groups.length;
      groups.push({ name: 'other (' + (ordered.length - other) + ')', colour: OTHER });
      for (const [key] of ordered) if (!groupOf.has(key)) groupOf.set(key, other);
    }
    const group = new Uint16Array(nBlocks);
    for (let i = 0; i < nBlocks; i++) group[i] = groupOf.get(keys[i]);
    return { groups, group };
  }

  function layoutBlocks(width, colourBy) {
    const W = Math.max(1, Math.floor(width));
    const start = new Float64Array(nBlocks);
    const end = new Float64Array(nBlocks);
    const size = new Float64Array(nBlocks);
    for (let i = 0; i < nBlocks; i++) {
      start[i] = blocks.start_ns[i];
      end[i] = blocks.end_ns[i] < 0 ? Infinity : blocks.end_ns[i];
      size[i] = blocks.size[i];
    }
    // The largest blocks are drawn one by one.
    const big = new Uint8Array(nBlocks);
    if (nBlocks <= MAX_DRAWN) {
      big.fill(1);
    } else {
      const sorted = Float64Array.from(size).sort();
      const threshold = sorted[nBlocks - MAX_DRAWN];
      let taken = 0;
      for (let i = 0; i < nBlocks; i++) if (size[i] > threshold) { big[i] = 1; taken++; }
      for (let i = 0; i < nBlocks && taken < MAX_DRAWN; i++) {
        if (size[i] === threshold) { big[i] = 1; taken++; }
      }
    }
    const { groups, group } = buildGroups(colourBy);
    const G = groups.length;

    // Events (2i: allocation of block i, 2i+1: its free), bucketed by pixel column.
    const columnOf = (t) => Math.min(W - 1, Math.max(0, Math.floor((t / endNs) * W)));
    const counts = new Int32Array(W + 1);
    let nEvents = 0;
    for (let i = 0; i < nBlocks; i++) {
      counts[columnOf(start[i]) + 1]++;
      nEvents++;
      if (end[i] !== Infinity) { counts[columnOf(end[i]) + 1]++; nEvents++; }
    }
    for (let c = 0; c < W; c++) counts[c + 1] += counts[c];
    const order = new Int32Array(nEvents);
    const fill = counts.slice(0, W);
    for (let i = 0; i < nBlocks; i++) {
      order[fill[columnOf(start[i])]++] = 2 * i;
      if (end[i] !== Infinity) order[fill[columnOf(end[i])]++] = 2 * i + 1;
    }
    const timeOf = (e) => (e & 1 ? end[e >> 1] : start[e >> 1]);
    // Within a column: by time, frees before allocations at the same time.
    const byTime = (a, b) => timeOf(a) - timeOf(b) || (b & 1) - (a & 1);
    for (let c = 0; c < W; c++) {
      if (counts[c + 1] - counts[c] > 1) order.subarray(counts[c], counts[c + 1]).sort(byTime);
    }

    // Sweep.
    const live = []; // big blocks in stack order
    const offset = new Float64Array(nBlocks);
    const stepsX = new Map(); // big block -> [x...] (pixels from the plot's left)
    const stepsY = new Map(); // big block -> [offset...]
    const endX = new Float64Array(nBlocks).fill(W);
    const small = new Float64Array(G);
    const columnSmall = new Float64Array(G * W);
    const columnBig = new Float64Array(W);
    const columnTop = new Float64Array(W);
    let bigTotal = 0;
    let smallTotal = 0;
    let peak = 0;
    let peakNs = 0;
    let peakBlock = -1;
    const xOf = (t) => (t / endNs) * W;
    for (let c = 0; c < W; c++) {
      let columnMax = bigTotal + smallTotal;
      for (let g = 0; g < G; g++) columnSmall[g * W + c] = small[g];
      for (let k = counts[c]; k < counts[c + 1]; k++) {
        const e = order[k];
        const b = e >> 1;
        const s = size[b];
        if (e & 1) {
          if (big[b]) {
            const at = live.indexOf(b);
            live.splice(at, 1);
            const x = xOf(end[b]);
            endX[b] = x;
            for (let j = at; j < live.length; j++) {
              const above = live[j];
              offset[above] -= s;
              const xs = stepsX.get(above);
              const ys = stepsY.get(above);
              const last = xs.length - 1;
              if (Math.floor(xs[last]) === Math.floor(x)) ys[last] = offset[above];
              else { xs.push(x); ys.push(offset[above]); }
            }
            bigTotal -= s;
          } else {
            small[group[b]] -= s;
            smallTotal -= s;
          }
        } else {
          if (big[b]) {
            offset[b] = bigTotal;
            live.push(b);
            stepsX.set(b, [xOf(start[b])]);
            stepsY.set(b, [bigTotal]);
            bigTotal += s;
          } else {
            small[group[b]] += s;
            smallTotal += s;
          }
          const total = bigTotal + smallTotal;
          if (total > peak) {
            peak = total;
            peakNs = start[b];
            peakBlock = b;
          }
        }
        const total = bigTotal + smallTotal;
        if (total > columnMax) {
          columnMax = total;
          for (let g = 0; g < G; g++) columnSmall[g * W + c] = small[g];
        }
      }
      columnBig[c] = bigTotal;
      let top = bigTotal;
      for (let g = 0; g < G; g++) top += columnSmall[g * W + c];
      columnTop[c] = top;
    }
    let drawn = 0;
    for (let i = 0; i < nBlocks; i++) drawn += big[i];
    let maxTop = peak;
    for (let c = 0; c < W; c++) if (columnTop[c] > maxTop) maxTop = columnTop[c];
    return {
      W, G, groups, group, big, start, end, size, stepsX, stepsY, endX,
      columnSmall, columnBig, peak, peakNs, peakBlock, maxTop, drawn,
    };
  }

  function drawBlocks(view, colourBy) {
    const { ctx, plot } = view;
    const L = layoutBlocks(plot.w, colourBy);
    const maxBytes = Math.max(1, L.maxTop * 1.08);
    axes(view, maxBytes);
    const yOf = (v) => plot.y + plot.h - (v / maxBytes) * plot.h;
    const x0 = plot.x;

    // The summed small blocks, on top of the drawn ones, one band per group.
    ctx.save();
    ctx.globalAlpha = 0.55;
    const base = Float64Array.from(L.columnBig);
    for (let g = 0; g < L.G; g++) {
      let any = false;
      for (let c = 0; c < L.W; c++) if (L.columnSmall[g * L.W + c] > 0) { any = true; break; }
      if (!any) continue;
      ctx.fillStyle = L.groups[g].colour;
      ctx.beginPath();
      ctx.moveTo(x0, yOf(base[0]));
      for (let c = 0; c < L.W; c++) {
        ctx.lineTo(x0 + c, yOf(base[c]));
        ctx.lineTo(x0 + c + 1, yOf(base[c]));
      }
      for (let c = L.W - 1; c >= 0; c--) {
        const top = base[c] + L.columnSmall[g * L.W + c];
        ctx.lineTo(x0 + c + 1, yOf(top));
        ctx.lineTo(x0 + c, yOf(top));
      }
      ctx.closePath();
      ctx.fill();
      for (let c = 0; c < L.W; c++) base[c] += L.columnSmall[g * L.W + c];
    }
    ctx.restore();

    // The drawn blocks: one path per group and shade, each block a stepped polygon.
    const paths = [];
    for (let g = 0; g < L.G; g++) paths.push([new Path2D(), new Path2D()]);
    let parity = 0;
    for (const [b, xs] of L.stepsX) {
      const ys = L.stepsY.get(b);
      const s = L.size[b];
      const path = paths[L.group[b]][parity];
      parity ^= 1;
      const xa = xs[0];
      let xb = L.endX[b];
      if (xb - xa < 1) xb = xa + 1;
      path.moveTo(x0 + xa, yOf(ys[0]));
      for (let i = 1; i < xs.length; i++) {
        path.lineTo(x0 + xs[i], yOf(ys[i - 1]));
        path.lineTo(x0 + xs[i], yOf(ys[i]));
      }
      const n = xs.length - 1;
      path.lineTo(x0 + xb, yOf(ys[n]));
      path.lineTo(x0 + xb, yOf(ys[n] + s));
      for (let i = n; i >= 1; i--) {
        path.lineTo(x0 + xs[i], yOf(ys[i] + s));
        path.lineTo(x0 + xs[i], yOf(ys[i - 1] + s));
      }
      path.lineTo(x0 + xa, yOf(ys[0] + s));
      path.closePath();
    }
    for (let g = 0; g < L.G; g++) {
      ctx.fillStyle = L.groups[g].colour;
      ctx.fill(paths[g][0]);
      ctx.fillStyle = shade(L.groups[g].colour);
      ctx.fill(paths[g][1]);
    }

    const px = x0 + (L.peakNs / endNs) * plot.w;
    let text = 'peak ' + fmtBytes(L.peak) + ' at ' + fmtTime(L.peakNs);
    if (L.peakBlock >= 0) {
      const b = L.peakBlock;
      text += ' (' + opLabel(blocks.op[b]) + ', ' + scopeLabel(blocks.scope[b]) + ')';
    }
    markPeak(view, px, yOf(L.peak), text);
    legend(L.groups, (L.drawn < nBlocks
      ? 'Solid: the ' + L.drawn + ' largest blocks, one by one; lighter: the other ' +
        (nBlocks - L.drawn) + ' blocks summed per pixel column.'
      : 'Each band is one heap block, from its allocation to its free.') +
      ' Blocks allocated during the profile only: the memory held before it is in the chart below.');
    layout = { kind: 'blocks', L, plot, maxBytes };
    status.peakBytes = L.peak;
    status.peakNs = L.peakNs;
    status.drawnBlocks = L.drawn;
  }

  // A slightly lighter variant of a colour, to tell neighbouring blocks apart.
  function shade(colour) {
    const n = parseInt(colour.slice(1), 16);
    const mix = (v) => Math.round(v + (255 - v) * 0.22);
    const r = mix(n >> 16);
    const g = mix((n >> 8) & 255);
    const b = mix(n & 255);
    return 'rgb(' + r + ',' + g + ',' + b + ')';
  }

  function legend(groups, note) {
    const element = document.getElementById('legend');
    element.innerHTML = groups
      .map((g) => '<span><i style="background:' + g.colour + '"></i>' + escapeHtml(g.name) + '</span>')
      .join('');
    document.getElementById('timeline-note').textContent = note;
  }

  // Without allocation events: the per-op counters as an area.
  function drawCounters(view) {
    const { ctx, plot } = view;
    if (counters.t.length === 0) {
      axes(view, 1);
      message(view, 'No memory was sampled: start the profiler with Profiler::start_with_memory.');
      layout = null;
      return;
    }
    let max = 1;
    for (let i = 0; i < counters.t.length; i++) {
      max = Math.max(max, counters.inUse[i], counters.reserved[i]);
    }
    const maxBytes = max * 1.08;
    axes(view, maxBytes);
    const yOf = (v) => plot.y + plot.h - (v / maxBytes) * plot.h;
    ctx.save();
    ctx.fillStyle = 'rgba(31,119,180,0.25)';
    ctx.beginPath();
    ctx.moveTo(plot.x, yOf(0));
    let column = -1;
    for (let i = 0; i < counters.t.length; i++) {
      const x = plot.x + (counters.t[i] / endNs) * plot.w;
      if (Math.floor(x) === column && i + 1 < counters.t.length) continue;
      column = Math.floor(x);
      ctx.lineTo(x, yOf(counters.inUse[i]));
    }
    ctx.lineTo(plot.x + plot.w, yOf(counters.inUse[counters.t.length - 1]));
    ctx.lineTo(plot.x + plot.w, yOf(0));
    ctx.closePath();
    ctx.fill();
    ctx.restore();
    decimatedLine(view, counters.t, counters.reserved, maxBytes, '#ff7f0e', 1.5);
    decimatedLine(view, counters.t, counters.inUse, maxBytes, '#1f77b4', 1.5);
    const p = counterPeak;
    const op = counters.op[p];
    markPeak(view, plot.x + (counters.t[p] / endNs) * plot.w, yOf(counters.inUse[p]),
      'peak ' + fmtBytes(counters.inUse[p]) + ' after ' + opNames[ops.name[op]] +
      ' (' + scopeLabel(ops.scope[op]) + ')');
    legend([{ name: 'in use', colour: '#1f77b4' }, { name: 'reserved', colour: '#ff7f0e' }],
      'No allocation events in this profile: the heap in use and reserved after each operation.');
    layout = { kind: 'counters', plot, maxBytes };
    status.peakBytes = counters.inUse[p];
    status.peakNs = counters.t[p];
  }

  function drawMemory() {
    const view = setup(document.getElementById('memory'));
    if (counters.t.length === 0) {
      axes(view, 1);
      message(view, 'No memory was sampled: start the profiler with Profiler::start_with_memory.');
      return;
    }
    let max = 1;
    for (let i = 0; i < counters.t.length; i++) {
      max = Math.max(max, counters.inUse[i], counters.reserved[i]);
    }
    const maxBytes = max * 1.08;
    axes(view, maxBytes);
    decimatedLine(view, counters.t, counters.reserved, maxBytes, '#ff7f0e', 1.5);
    decimatedLine(view, counters.t, counters.inUse, maxBytes, '#1f77b4', 1.5);
    const p = counterPeak;
    const { plot } = view;
    markPeak(view, plot.x + (counters.t[p] / endNs) * plot.w,
      plot.y + plot.h - (counters.inUse[p] / maxBytes) * plot.h,
      'peak in use ' + fmtBytes(counters.inUse[p]));
    document.getElementById('memory-legend').innerHTML =
      '<span><i style="background:#1f77b4"></i>in use</span>' +
      '<span><i style="background:#ff7f0e"></i>reserved</span>';
  }

  function colourBy() {
    const checked = document.querySelector('input[name="colour"]:checked');
    return checked ? checked.value : 'scope';
  }

  function drawTimeline() {
    const view = setup(document.getElementById('timeline'));
    if (nBlocks > 0) {
      status.mode = 'blocks';
      document.getElementById('timeline-title').textContent = 'Active memory timeline';
      drawBlocks(view, colourBy());
    } else {
      status.mode = 'counters';
      document.getElementById('timeline-title').textContent = 'Active memory (per-operation counters)';
      document.getElementById('colour-controls').hidden = true;
      drawCounters(view);
    }
  }

  // ---- hover ---------------------------------------------------------------------------------

  function hover(event) {
    const canvas = document.getElementById('timeline');
    const tooltip = document.getElementById('tooltip');
    const rect = canvas.getBoundingClientRect();
    const mx = event.clientX - rect.left;
    const my = event.clientY - rect.top;
    const text = layout ? describe(mx, my) : null;
    if (!text) {
      tooltip.hidden = true;
      return;
    }
    tooltip.textContent = text;
    tooltip.hidden = false;
    const left = mx + 14 + tooltip.offsetWidth > rect.width ? mx - 14 - tooltip.offsetWidth : mx + 14;
    tooltip.style.left = Math.max(0, left) + 'px';
    tooltip.style.top = Math.max(0, my + 14) + 'px';
  }

  function describe(mx, my) {
    const { plot, maxBytes } = layout;
    if (mx < plot.x || mx > plot.x + plot.w || my < plot.y || my > plot.y + plot.h) return null;
    const t = ((mx - plot.x) / plot.w) * endNs;
    const bytes = ((plot.y + plot.h - my) / plot.h) * maxBytes;
    if (layout.kind === 'counters') {
      let best = -1;
      for (let i = 0; i < counters.t.length; i++) {
        if (counters.t[i] <= t) best = i;
        else break;
      }
      if (best < 0) return null;
      const op = counters.op[best];
      return 'after ' + opNames[ops.name[op]] + ' (' + scopeLabel(ops.scope[op]) + ')\n' +
        'in use ' + fmtBytes(counters.inUse[best]) + ', reserved ' + fmtBytes(counters.reserved[best]) +
        '\nat ' + fmtTime(counters.t[best]);
    }
    const L = layout.L;
    const x = mx - plot.x;
    for (const [b, xs] of L.stepsX) {
      let xb = L.endX[b];
      if (xb - xs[0] < 1) xb = xs[0] + 1;
      if (x < xs[0] || x > xb) continue;
      let lo = 0;
      let hi = xs.length - 1;
      while (lo < hi) {
        const mid = (lo + hi + 1) >> 1;
        if (xs[mid] <= x) lo = mid;
        else hi = mid - 1;
      }
      const bottom = L.stepsY.get(b)[lo];
      if (bytes >= bottom && bytes <= bottom + L.size[b]) {
        const freed = L.end[b] === Infinity ? 'live at the end' : 'freed at ' + fmtTime(L.end[b]);
        return fmtBytes(L.size[b]) + ' block\noperation: ' + opLabel(blocks.op[b]) +
          '\nscope: ' + scopeLabel(blocks.scope[b]) +
          '\nallocated at ' + fmtTime(L.start[b]) + ', ' + freed;
      }
    }
    const c = Math.min(L.W - 1, Math.max(0, Math.floor(x)));
    let base = L.columnBig[c];
    for (let g = 0; g < L.G; g++) {
      const s = L.columnSmall[g * L.W + c];
      if (s > 0 && bytes >= base && bytes <= base + s) {
        return fmtBytes(s) + ' in smaller blocks\n' + (colourBy() === 'op' ? 'operation: ' : 'scope: ') +
          L.groups[g].name + '\nat ' + fmtTime(t);
      }
      base += s;
    }
    return null;
  }

  // ---- the table -------------------------------------------------------------------------------

  const sort = { key: 'total_ns', up: false };

  function drawTable() {
    const rows = data.table.slice();
    const key = sort.key;
    rows.sort((a, b) => {
      let order;
      if (key === 'name') order = a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
      else order = a[key] - b[key];
      if (!sort.up) order = -order;
      return order || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    });
    const html = rows.map((row) => {
      const name = row.scope ? '[' + row.name + ']' : row.name;
      return '<tr' + (row.scope ? ' class="scope"' : '') + '><td class="text">' + escapeHtml(name) +
        '</td><td>' + row.calls + '</td><td>' + fmtTime(row.total_ns) + '</td><td>' +
        fmtTime(row.self_ns) + '</td><td>' + fmtTime(row.average_ns) + '</td><td>' +
        fmtBytes(row.output_bytes) + '</td></tr>';
    });
    document.querySelector('#ops-table tbody').innerHTML = html.join('');
    for (const th of document.querySelectorAll('#ops-table th')) {
      th.classList.toggle('sorted', th.dataset.key === key);
      th.classList.toggle('up', th.dataset.key === key && sort.up);
    }
    status.rows = rows.length;
  }

  function summary() {
    const parts = [
      nOps + ' operations',
      data.scope_names.length + ' scope names',
      data.allocation_events + ' allocation events (' + nBlocks + ' blocks)',
      'span ' + fmtTime(endNs),
    ];
    if (data.dropped > 0) parts.push(data.dropped + ' events dropped (max_entries)');
    document.getElementById('summary').textContent = parts.join(' · ');
  }

  function countDrawn() {
    const canvas = document.getElementById('timeline');
    const ctx = canvas.getContext('2d');
    const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
    let count = 0;
    for (let i = 0; i < pixels.length; i += 4) {
      // Neither white nor the grey of grid and text.
      const r = pixels[i];
      const g = pixels[i + 1];
      const b = pixels[i + 2];
      if (Math.max(r, g, b) - Math.min(r, g, b) > 24) count++;
    }
    return count;
  }

  function publish() {
    document.getElementById('viewer-status').textContent = JSON.stringify(status);
  }

  function render() {
    const begin = performance.now();
    drawTimeline();
    drawMemory();
    status.drawMs = Math.round(performance.now() - begin);
  }

  try {
    summary();
    drawTable();
    render();
    status.drawnPixels = countDrawn();
    // From the navigation's start (reading the page, parsing the data) to the drawing done.
    status.renderMs = Math.round(performance.now());
    status.scriptMs = Math.round(performance.now() - started);
    status.ready = true;
  } catch (error) {
    status.error = String(error && error.stack ? error.stack : error);
  }
  publish();

  for (const th of document.querySelectorAll('#ops-table th')) {
    th.addEventListener('click', () => {
      const key = th.dataset.key;
      if (sort.key === key) sort.up = !sort.up;
      else {
        sort.key = key;
        sort.up = key === 'name';
      }
      drawTable();
    });
  }
  for (const input of document.querySelectorAll('input[name="colour"]')) {
    input.addEventListener('change', () => render());
  }
  const timeline = document.getElementById('timeline');
  timeline.addEventListener('mousemove', hover);
  timeline.addEventListener('mouseleave', () => { document.getElementById('tooltip').hidden = true; });
  let resizing = 0;
  window.addEventListener('resize', () => {
    clearTimeout(resizing);
    resizing = setTimeout(render, 150);
  });
})();

// Dead letters page. Vanilla JS, no build step. Every piece of data reaches the page through
// textContent or a text node (the el() helper), never as markup.
"use strict";

(() => {
  const PAGE_SIZE = 50;
  const $ = (selector) => document.querySelector(selector);

  const state = {
    me: null,
    filter: {}, // the applied filter (the form may hold edits not applied yet)
    cursors: [null], // the cursor of every page shown so far: keyset pagination has no page numbers
    page: null,
    total: null,
    selected: new Set(),
    openId: null,
    loadSeq: 0,
    dialog: null,
  };

  // --- helpers ------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : String(child)); // a string becomes a text node
    }
    return node;
  }

  const fmtInt = (n) => String(n).replace(/\B(?=(\d{3})+(?!\d))/g, " ");
  const plural = (n, word) => `${fmtInt(n)} ${word}${n === 1 ? "" : "s"}`;

  function fmtTime(iso) {
    if (!iso) return "";
    const date = new Date(iso);
    return Number.isNaN(date.getTime()) ? String(iso) : date.toISOString().slice(0, 19).replace("T", " ");
  }

  // A datetime-local value is read as UTC, like every time on this page.
  function localToIso(value) {
    if (!value) return "";
    return (value.length === 16 ? `${value}:00` : value) + "Z";
  }

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function api(path, { body } = {}) {
    const init = { credentials: "same-origin", headers: { Accept: "application/json" } };
    if (body !== undefined) {
      init.method = "POST";
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let data = null;
    try {
      data = await response.json();
    } catch {
      data = null;
    }
    if (!response.ok) {
      let detail = data && data.detail;
      if (Array.isArray(detail)) {
        detail = detail.map((d) => `${(d.loc || []).slice(1).join(".")}: ${d.msg}`).join("; ");
      }
      if (response.status === 401) detail = "Your Airflow session has ended: reload the page to log in again.";
      else if (response.status === 403 && body !== undefined) {
        detail = `Not allowed: replay and purge need permission to trigger the ${state.me ? state.me.dag_id : "dlq_replay"} DAG (${detail || "forbidden"}).`;
      }
      throw new ApiError(response.status, detail || `The server answered HTTP ${response.status}.`);
    }
    return data;
  }

  function showMessage(kind, text, ...extra) {
    const box = $("#message");
    box.className = `message ${kind}`;
    box.replaceChildren(text, ...extra);
    box.hidden = !text;
  }

  function guard(fn) {
    return async (...args) => {
      try {
        await fn(...args);
      } catch (error) {
        showMessage("error", error.message || String(error));
      }
    };
  }

  const FILTER_TEXT = {
    destination: (v) => `destination ${v}`,
    dead_reason: (v) => `dead reason ${v}`,
    written_by: (v) => `written by ${v}`,
    error_class: (v) => `error class like ${v}`,
    search: (v) => `reason text contains “${v}”`,
    since: (v) => `dead since ${fmtTime(v)}`,
    until: (v) => `dead before ${fmtTime(v)}`,
    ids: (v) => (v.length <= 5 ? `job${v.length === 1 ? "" : "s"} ${v.join(", ")}` : `${fmtInt(v.length)} jobs by id`),
    limit: (v) => `at most ${fmtInt(v)}`,
    chains: (v) => (v.length <= 3 ? `chain${v.length === 1 ? "" : "s"} ${v.join(", ")}` : `${fmtInt(v.length)} chains`),
    why: (v) => `why: ${v}`,
  };

  function describeFilter(filter) {
    const parts = Object.entries(filter || {})
      .filter(([name]) => name in FILTER_TEXT)
      .map(([name, value]) => FILTER_TEXT[name](value));
    return parts.length ? parts.join(", ") : "all dead jobs";
  }

  // --- filters ------------------------------------------------------------------------------------

  function readFilter() {
    const filter = {};
    const text = (id) => $(id).value.trim();
    const fields = {
      destination: text("#f-destination"),
      dead_reason: text("#f-dead-reason"),
      written_by: text("#f-written-by"),
      error_class: text("#f-error-class"),
      search: text("#f-search"),
      since: localToIso(text("#f-since")),
      until: localToIso(text("#f-until")),
    };
    for (const [name, value] of Object.entries(fields)) if (value) filter[name] = value;
    return filter;
  }

  function fillSelect(select, counts, allLabel) {
    const current = select.value;
    const options = [el("option", { value: "" }, allLabel)];
    const names = [...counts.keys()].sort();
    if (current && !counts.has(current)) names.unshift(current);
    for (const name of names) {
      options.push(el("option", { value: name }, `${name} (${fmtInt(counts.get(name) || 0)})`));
    }
    select.replaceChildren(...options);
    select.value = current;
  }

  async function loadFacets() {
    const facets = await api("api/facets");
    const destinations = new Map();
    const reasons = new Map();
    for (const f of facets) {
      if (f.destination) destinations.set(f.destination, (destinations.get(f.destination) || 0) + f.count);
      reasons.set(f.dead_reason, (reasons.get(f.dead_reason) || 0) + f.count);
    }
    fillSelect($("#f-destination"), destinations, "All destinations");
    fillSelect($("#f-dead-reason"), reasons, "All reasons");
    const writers = await api("api/writers");
    const select = $("#f-written-by");
    const current = select.value;
    select.replaceChildren(el("option", { value: "" }, "Anyone"), ...writers.map((w) => el("option", { value: w }, w)));
    select.value = current;
  }

  async function applyFilter() {
    state.filter = readFilter();
    state.cursors = [null];
    closeDetail();
    showMessage("", "");
    await loadPage();
  }

  // --- the list -----------------------------------------------------------------------------------

  async function loadPage({ count = true } = {}) {
    const seq = ++state.loadSeq;
    const params = new URLSearchParams(state.filter);
    const cursor = state.cursors[state.cursors.length - 1];
    if (cursor) params.set("cursor", cursor);
    params.set("page_size", String(PAGE_SIZE));
    if (!count) params.set("count", "false");
    $("#jobs").setAttribute("aria-busy", "true");
    try {
      const page = await api(`api/dead-letters?${params}`);
      if (seq !== state.loadSeq) return; // a newer request was made meanwhile
      state.page = page;
      if (page.total >= 0) state.total = { total: page.total, capped: page.total_capped };
      state.selected.clear();
      renderPage();
    } finally {
      if (seq === state.loadSeq) $("#jobs").removeAttribute("aria-busy");
    }
  }

  function renderPage() {
    const { jobs, next_cursor: nextCursor } = state.page;
    const canOperate = state.me.can_operate;
    const rows = jobs.map((job) => {
      const check = canOperate
        ? el("td", { class: "check" },
            el("input", {
              type: "checkbox",
              "aria-label": `Select job ${job.id}`,
              "data-id": job.id,
              onchange: (event) => {
                if (event.target.checked) state.selected.add(job.id);
                else state.selected.delete(job.id);
                renderSelection();
              },
              onclick: (event) => event.stopPropagation(),
            }))
        : null;
      return el("tr", { "data-id": job.id, class: job.id === state.openId ? "open" : null, onclick: () => openDetail(job.id) },
        check,
        el("td", { class: "when", title: job.dead_at }, fmtTime(job.dead_at)),
        el("td", {}, job.destination || el("span", { class: "muted" }, "(none)")),
        el("td", {}, el("span", { class: `badge ${job.dead_reason}` }, job.dead_reason)),
        el("td", { title: job.source_topic }, job.written_by || el("span", { class: "muted" }, "?")),
        el("td", { class: "mono" }, job.error_class || ""),
        el("td", { class: "num" }, job.attempt),
        el("td", { class: "reason", title: job.reason || "" }, job.reason || ""));
    });
    $("#jobs tbody").replaceChildren(...rows);
    $("#empty").hidden = jobs.length > 0;

    const filtered = Object.keys(state.filter).length > 0;
    if (state.total) {
      const n = `${fmtInt(state.total.total)}${state.total.capped ? "+" : ""}`;
      const noun = state.total.total === 1 && !state.total.capped ? "dead job" : "dead jobs";
      $("#total").textContent = `${n} ${noun}${filtered ? " match" : ""}`;
    }
    const pageNo = state.cursors.length;
    const first = (pageNo - 1) * PAGE_SIZE + 1;
    $("#page-info").textContent = jobs.length ? `Page ${pageNo} · jobs ${fmtInt(first)}–${fmtInt(first + jobs.length - 1)}, newest first` : "";
    $("#newer").disabled = pageNo <= 1;
    $("#older").disabled = !nextCursor;
    for (const button of document.querySelectorAll('[data-scope="filter"]')) button.disabled = jobs.length === 0;
    renderSelection();
  }

  function renderSelection() {
    const n = state.selected.size;
    for (const button of document.querySelectorAll('[data-scope="selected"]')) {
      button.disabled = n === 0;
      button.textContent = `${ACTIONS[button.dataset.action].title} selected${n ? ` (${n})` : ""}`;
    }
    const all = $("#select-page");
    const boxes = document.querySelectorAll("#jobs tbody input[type=checkbox]");
    all.checked = boxes.length > 0 && n === boxes.length;
    all.indeterminate = n > 0 && n < boxes.length;
  }

  // --- the detail ---------------------------------------------------------------------------------

  const FIELDS = [
    ["status", "Status"],
    ["retry_id", "Retry id"],
    ["destination", "Destination"],
    ["destination_partition", "Destination partition"],
    ["policy", "Policy"],
    ["attempt", "Attempt"],
    ["dead_reason", "Dead reason"],
    ["dead_at", "Dead at", "time"],
    ["error_class", "Error class"],
    ["reason", "Reason"],
    ["consumer_group", "Consumer group"],
    ["first_seen_at", "First failed", "time"],
    ["due_at", "Due at", "time"],
    ["dlq_topic", "DLQ topic"],
    ["dlq_published_at", "On the DLQ topic since", "time"],
    ["source", "Read from"],
    ["original", "Originally from"],
    ["published_at", "Published at", "time"],
    ["publish_failures", "Publish failures"],
    ["last_error", "Last error"],
  ];

  function bytesBlock(rendered) {
    if (!rendered) return el("p", { class: "muted" }, "(none)");
    if (rendered.encoding === "hidden") {
      return el("p", { class: "muted hidden-payload" },
        `hidden (${plural(rendered.size, "byte")}): seeing payloads needs the permission to trigger ${state.me.dag_id} runs`);
    }
    const notes = [
      el("span", { class: "badge" }, rendered.encoding === "hex" ? "binary, shown as hex" : "UTF-8 text"),
      el("span", {}, plural(rendered.size, "byte")),
    ];
    if (rendered.truncated) {
      notes.push(el("span", { class: "truncated" },
        `truncated, ${plural(rendered.size, "byte")}: the first ${fmtInt(state.me.show_bytes)} shown`));
    }
    const text = rendered.text === "" ? el("span", { class: "muted" }, "(empty)") : rendered.text;
    return el("div", { class: `bytes-block ${rendered.encoding}` },
      el("pre", { class: "bytes" }, text), el("div", { class: "bytes-meta" }, notes));
  }

  function fieldValue(job, name, kind) {
    if (name === "source") {
      return `${job.source_topic} [${job.source_partition}] @ ${job.source_offset}`;
    }
    if (name === "original") {
      if (!job.original_topic) return null;
      const partition = job.original_partition === null ? "" : ` [${job.original_partition}]`;
      const offset = job.original_offset === null ? "" : ` @ ${job.original_offset}`;
      return `${job.original_topic}${partition}${offset}`;
    }
    const value = job[name];
    if (value === null || value === undefined || value === "") {
      return name === "dlq_published_at" ? "not yet" : null;
    }
    return kind === "time" ? `${fmtTime(value)} UTC` : String(value);
  }

  async function openDetail(id) {
    state.openId = id;
    for (const row of document.querySelectorAll("#jobs tbody tr")) {
      row.classList.toggle("open", Number(row.dataset.id) === id);
    }
    const job = await api(`api/dead-letters/${encodeURIComponent(id)}`).catch((error) => {
      showMessage("error", error.message);
      return null;
    });
    if (!job || state.openId !== id) return;
    $("#detail-title").textContent = `Job ${job.id}`;
    const fields = [];
    for (const [name, label, kind] of FIELDS) {
      const value = fieldValue(job, name, kind);
      if (value === null) continue;
      fields.push(el("dt", {}, label), el("dd", { class: name === "retry_id" ? "mono" : null, "data-field": name }, value));
    }
    $("#detail-fields").replaceChildren(...fields);
    $("#detail-key").replaceChildren(bytesBlock(job.key));
    $("#detail-value").replaceChildren(bytesBlock(job.value));
    const headers = job.headers.map((h) =>
      el("tr", {}, el("td", {}, h.name), el("td", {}, h.value ? bytesBlock(h.value) : el("span", { class: "muted" }, "(null)"))));
    $("#detail-headers tbody").replaceChildren(...headers);
    $("#detail-headers").hidden = headers.length === 0;
    $("#detail-actions").hidden = !(state.me.can_operate && job.status === "dead");
    $("#detail-reevaluate").hidden = job.dead_reason !== "invalid";
    $("#detail").hidden = false;
    $("#layout").classList.add("with-detail");
    history.replaceState(null, "", `#job=${job.id}`);
  }

  function closeDetail() {
    state.openId = null;
    $("#detail").hidden = true;
    $("#layout").classList.remove("with-detail");
    for (const row of document.querySelectorAll("#jobs tbody tr.open")) row.classList.remove("open");
    if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  }

  // --- replay, purge, re-evaluate: a dry run, a confirmation, then the real thing -----------------

  const ACTIONS = {
    replay: {
      title: "Replay", verb: "replayed", doing: "Replaying", done: "Replayed",
      effect: "They become due now, and the publish loop sends them to their destinations.",
    },
    purge: {
      title: "Purge", verb: "purged", doing: "Purging", done: "Purged",
      effect: "They are deleted from PostgreSQL; their records stay on the DLQ topic. This cannot be undone.",
    },
    reevaluate: {
      title: "Re-evaluate", verb: "re-evaluated and made pending", doing: "Re-evaluating", done: "Made pending",
      effect: "They pass the current policies: they become pending with their original bytes and are sent when due. The others stay dead, with what the policies say of them now.",
    },
  };

  async function startAction(action, scope, ids) {
    const selection = scope === "filter"
      ? { body: { ...state.filter }, text: describeFilter(state.filter) }
      : { body: { ids }, text: describeFilter({ ids }) };
    const dry = await api(`api/${action}`, { body: { ...selection.body, dry_run: true } });
    openDialog(action, selection, dry);
  }

  function openDialog(action, selection, dry) {
    state.dialog = { action, selection };
    const n = dry.would_affect;
    const replay = action === "replay";
    const { title, verb, effect } = ACTIONS[action];
    $("#dialog-title").textContent = `${title} ${plural(n, "dead job")}?`;
    $("#dialog-selection").textContent = `Selection: ${selection.text}.`;
    const viaDag = n > dry.page_limit;
    const handoff = viaDag
      ? ` That is more than the ${fmtInt(dry.page_limit)} this page changes at once: a dlq_replay DAG run will do it, with its own log and progress.`
      : "";
    $("#dialog-body").textContent =
      `Dry run: ${fmtInt(n)} of ${fmtInt(dry.matched)} selected dead jobs would be ${verb}. ${n ? effect : ""}${handoff}`;
    const skipped = Object.entries(dry.skipped || {}).filter(([, count]) => count > 0);
    $("#dialog-skipped").replaceChildren(...skipped.map(([cause, count]) => el("li", {}, `${fmtInt(count)} left alone: ${cause}`)));
    $("#dialog-reset-row").hidden = !replay;
    $("#dialog-reset").checked = false;
    $("#dialog-rate-row").hidden = !replay || !n;
    $("#dialog-rate").value = "";
    $("#dialog-pace").hidden = !replay || !n;
    $("#dialog-pace").textContent = !dry.rate_per_s
      ? "Not paced: every job falls due at once (the default for a replay of this size)."
      : `Paced by default at ${fmtInt(dry.rate_per_s)} jobs/s per destination: the last would fall due about ${fmtInt(Math.round(dry.paced_s))} s after the start.`;
    $("#dialog-audit").textContent = `The dry run is recorded as audit #${dry.audit_id}.`;
    const confirm = $("#dialog-confirm");
    if (!n) confirm.textContent = `Nothing to ${action}`;
    else if (viaDag) confirm.textContent = `Start a dlq_replay run to ${action} ${plural(n, "job")}`;
    else confirm.textContent = `${title} ${plural(n, "job")}`;
    confirm.disabled = n === 0;
    confirm.classList.toggle("danger", action === "purge");
    $("#dialog").hidden = false;
    $("#dialog-cancel").focus();
  }

  function closeDialog() {
    state.dialog = null;
    $("#dialog").hidden = true;
  }

  async function confirmAction() {
    const { action, selection } = state.dialog;
    const replay = action === "replay";
    const { doing, done } = ACTIONS[action];
    const confirm = $("#dialog-confirm");
    confirm.disabled = true;
    confirm.textContent = `${doing}…`;
    showMessage("info", `${doing} ${selection.text}… (in batches of 10 000 jobs, about 2 s per 50 000)`);
    let result;
    try {
      result = await api(`api/${action}`, {
        body: { ...selection.body, dry_run: false, reset_attempts: replay && $("#dialog-reset").checked,
          ...(replay && $("#dialog-rate").value !== "" ? { rate: Number($("#dialog-rate").value) } : {}) },
      });
    } finally {
      closeDialog();
    }
    if (result.handed_to_dag) {
      showMessage("ok", `${result.summary}: `,
        el("a", { href: result.dag_run_url, target: "_top" }, "follow the run in Airflow"), ".");
      await loadAudit();
      return;
    }
    const skipped = Object.entries(result.skipped || {}).filter(([, count]) => count > 0)
      .map(([cause, count]) => `${fmtInt(count)} ${cause}`);
    showMessage("ok",
      `${done} ${fmtInt(result.affected)} of ${fmtInt(result.matched)} selected dead jobs` +
      `${skipped.length ? ` (left alone: ${skipped.join("; ")})` : ""}${replay && result.reset_attempts ? ", attempts reset" : ""}` +
      `${replay && result.rate_per_s ? `, paced at ${fmtInt(result.rate_per_s)} jobs/s per destination (the last due in about ${fmtInt(Math.round(result.paced_s))} s)` : ""}` +
      ` — audit #${result.audit_id}.`);
    closeDetail();
    await Promise.all([loadPage(), loadFacets(), loadAudit()]);
  }

  // --- audit --------------------------------------------------------------------------------------

  async function loadAudit() {
    const rows = await api("api/audit?limit=10");
    $("#audit tbody").replaceChildren(...rows.map((row) => {
      const skipped = Object.entries(row.skipped || {}).filter(([, n]) => n > 0).map(([cause, n]) => `${fmtInt(n)} ${cause}`);
      return el("tr", { "data-audit-id": row.id },
        el("td", { class: "num" }, row.id),
        el("td", { class: "when" }, fmtTime(row.at)),
        el("td", {}, row.actor),
        el("td", {}, row.source),
        el("td", {}, row.action, " ",
          row.dry_run ? el("span", { class: "badge dry" }, "dry run") : null, " ",
          row.reset_attempts ? el("span", { class: "badge" }, "attempts reset") : null, " ",
          row.rate_per_s ? el("span", { class: "badge" }, `paced ${fmtInt(row.rate_per_s)}/s`) : null),
        el("td", { class: "selection" }, describeFilter(row.filter)),
        el("td", { class: "num" }, fmtInt(row.matched)),
        el("td", { class: "num" }, row.dry_run ? "—" : fmtInt(row.affected)),
        el("td", {}, skipped.join("; ")));
    }));
    $("#audit-empty").hidden = rows.length > 0;
  }

  // --- chains (ordered mode) ---------------------------------------------------------------------

  const fmtWait = (s) => (s < 120 ? `${Math.round(s)} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`);

  async function loadChains() {
    const rows = await api("api/chains?limit=50");
    $("#chains-section").hidden = rows.length === 0;
    $("#chains tbody").replaceChildren(...rows.map((c) => el("tr", { "data-chain": c.chain },
      el("td", { class: "selection" }, c.chain),
      el("td", {}, c.key === null ? "—" : c.key),
      el("td", {}, c.destination || "—"),
      el("td", {}, c.group || "—"),
      el("td", { class: "num" }, fmtInt(c.waiting)),
      el("td", {}, fmtWait(c.waited_s)),
      el("td", {}, c.stuck ? el("span", { class: "badge fatal" }, "stuck") : c.head_pending ? "pending" : (c.state || "—")),
      el("td", {}, state.me.can_operate && c.stuck
        ? el("button", { type: "button", "data-release": c.chain }, "Release") : ""))));
  }

  async function releaseChain(event) {
    const button = event.target.closest("button[data-release]");
    if (!button) return;
    const chain = button.dataset.release;
    const why = window.prompt(
      `Release chain ${chain} as if its head had died? Its pending head goes dead; its records are handled or dead-lettered by the consumer.\n\nA note for the audit (optional):`, "");
    if (why === null) return;
    const done = await api("api/chains/release", { body: { chains: [chain], why } });
    showMessage("ok", `Released ${fmtInt(done.released.length)} chain(s); ${fmtInt(done.heads_dead.length)} pending head(s) made dead.`);
    await Promise.all([loadChains(), loadAudit()]);
  }

  // --- breakers ----------------------------------------------------------------------------------

  async function loadBreakers() {
    const rows = await api("api/breakers");
    $("#breakers-section").hidden = rows.length === 0;
    $("#breakers tbody").replaceChildren(...rows.map((b) => el("tr", { "data-destination": b.destination },
      el("td", {}, b.destination),
      el("td", {}, b.state === "closed" ? "closed" : el("span", { class: "badge fatal" }, b.state)),
      el("td", {}, b.since ? new Date(b.since).toLocaleString() : "—"),
      el("td", { class: "num" }, fmtInt(b.paused)),
      el("td", { class: "num" }, fmtInt(b.trips)),
      el("td", {}, b.reason || "—"),
      el("td", {}, state.me.can_operate && b.state !== "closed"
        ? el("button", { type: "button", "data-close": b.destination }, "Close") : ""))));
  }

  async function closeBreaker(event) {
    const button = event.target.closest("button[data-close]");
    if (!button) return;
    const destination = button.dataset.close;
    const why = window.prompt(
      `Close the breaker of ${destination}? Its paused jobs go out at once, without a probe.\n\nA note (optional):`, "");
    if (why === null) return;
    const done = await api("api/breakers/close", { body: { destinations: [destination], why } });
    showMessage("ok", `Closed ${fmtInt(done.closed.length)} breaker(s): their paused jobs go.`);
    await loadBreakers();
  }

  // --- wiring -------------------------------------------------------------------------------------

  async function init() {
    state.me = await api("api/me");
    const canOperate = state.me.can_operate;
    $("#who").textContent = `Signed in as ${state.me.user}${canOperate ? "" : " · read only"}`;
    $("#actions").hidden = !canOperate;
    $("#readonly").hidden = canOperate;
    $("#select-page").closest("th").hidden = !canOperate;

    $("#filters").addEventListener("submit", guard(async (event) => {
      event.preventDefault();
      await applyFilter();
    }));
    for (const select of document.querySelectorAll("#filters select")) select.addEventListener("change", guard(applyFilter));
    $("#clear").addEventListener("click", guard(async () => {
      $("#filters").reset();
      await applyFilter();
    }));
    $("#older").addEventListener("click", guard(async () => {
      state.cursors.push(state.page.next_cursor);
      await loadPage({ count: false });
    }));
    $("#newer").addEventListener("click", guard(async () => {
      if (state.cursors.length > 1) state.cursors.pop();
      await loadPage({ count: false });
    }));
    $("#select-page").addEventListener("change", (event) => {
      for (const box of document.querySelectorAll("#jobs tbody input[type=checkbox]")) {
        box.checked = event.target.checked;
        const id = Number(box.dataset.id);
        if (box.checked) state.selected.add(id);
        else state.selected.delete(id);
      }
      renderSelection();
    });
    for (const button of document.querySelectorAll("#actions button[data-action]")) {
      button.addEventListener("click", guard(() =>
        startAction(button.dataset.action, button.dataset.scope, [...state.selected])));
    }
    $("#detail-close").addEventListener("click", closeDetail);
    $("#detail-replay").addEventListener("click", guard(() => startAction("replay", "selected", [state.openId])));
    $("#detail-purge").addEventListener("click", guard(() => startAction("purge", "selected", [state.openId])));
    $("#detail-reevaluate").addEventListener("click", guard(() => startAction("reevaluate", "selected", [state.openId])));
    $("#chains").addEventListener("click", guard(releaseChain));
    $("#breakers").addEventListener("click", guard(closeBreaker));
    $("#dialog-cancel").addEventListener("click", closeDialog);
    $("#dialog-confirm").addEventListener("click", guard(confirmAction));
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && state.dialog) closeDialog();
    });

    await Promise.all([loadFacets(), loadPage(), loadAudit(), loadChains(), loadBreakers()]);
    const linked = /^#job=(\d+)$/.exec(location.hash);
    if (linked) await openDetail(Number(linked[1]));
  }

  document.addEventListener("DOMContentLoaded", guard(init));
})();

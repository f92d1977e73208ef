// The mesh console's only script: actions (replay, purge, pause, resume)
// as POSTs carrying the page's CSRF token, a replay's progress, and the
// live page's server-sent events. Every text from the mesh is set with
// textContent, never as HTML.
"use strict";

(function () {
  const csrf = document.querySelector('meta[name="mesh-csrf"]').content;

  async function post(url, body) {
    const resp = await fetch(url, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Mesh-CSRF": csrf },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    let data = {};
    try { data = await resp.json(); } catch (e) { /* not JSON */ }
    if (!resp.ok) throw new Error(data.error || resp.status + " " + resp.statusText);
    return data;
  }

  function show(el, text, bad) {
    el.hidden = false;
    el.textContent = text;
    el.classList.toggle("bad", !!bad);
    el.classList.toggle("ok", !bad);
  }

  // A search leaves the fields left empty out of its URL, so that the
  // URL says what was asked and is short to share.
  document.querySelectorAll("form.search").forEach((f) => {
    f.addEventListener("submit", () => {
      f.querySelectorAll("input").forEach((i) => { if (i.value === "" && i.type !== "checkbox") i.disabled = true; });
    });
  });

  // Replay and purge, on a group's page and on a message's.
  const actions = document.querySelector(".actions[data-kept]");
  if (actions) {
    const kept = actions.dataset.kept;
    const confirmBox = document.getElementById("confirm");
    const confirmText = document.getElementById("confirm-text");
    const progress = document.getElementById("progress");
    const bar = document.getElementById("progress-bar");
    const ptext = document.getElementById("progress-text");
    const result = document.getElementById("result");
    let pending = null;

    const selectAll = document.getElementById("select-all");
    if (selectAll) {
      selectAll.addEventListener("change", () => {
        document.querySelectorAll("input.pick").forEach((c) => { c.checked = selectAll.checked; });
      });
    }
    function idsFor(scope) {
      if (scope === "this") return [actions.dataset.ids];
      const boxes = Array.from(document.querySelectorAll("input.pick"));
      return boxes.filter((c) => scope === "group" || c.checked).map((c) => c.value);
    }
    actions.querySelectorAll("button.act").forEach((b) => {
      b.addEventListener("click", () => {
        const ids = idsFor(b.dataset.scope);
        result.hidden = true;
        if (ids.length === 0) {
          show(result, "Select the messages to act on first.", true);
          return;
        }
        const what = ids.length === 1 ? "1 " + actions.dataset.one : ids.length + " " + actions.dataset.few;
        const verb = b.dataset.action === "replay" ? "Replay " + what + (kept === "dlq" ? " to the queues that gave up on them (attempts start over)?" : " to mesh.events?")
          : "Purge " + what + "? They are deleted for good.";
        pending = { action: b.dataset.action, ids: ids };
        confirmText.textContent = verb;
        confirmBox.hidden = false;
      });
    });
    document.getElementById("confirm-no").addEventListener("click", () => { confirmBox.hidden = true; pending = null; });
    document.getElementById("confirm-yes").addEventListener("click", async () => {
      confirmBox.hidden = true;
      if (!pending) return;
      const p = pending;
      pending = null;
      progress.hidden = false;
      bar.max = p.ids.length; bar.value = 0;
      ptext.textContent = "starting…";
      try {
        const body = { ids: p.ids };
        if (actions.dataset.queue) body.queue = actions.dataset.queue;
        const { job } = await post("/api/" + kept + "/" + p.action, body);
        for (;;) {
          const resp = await fetch("/api/jobs/" + encodeURIComponent(job), { credentials: "same-origin" });
          if (!resp.ok) throw new Error("the console lost track of the job (" + resp.status + "); reload to see what is left");
          const j = await resp.json();
          bar.max = Math.max(j.total, 1); bar.value = j.done;
          ptext.textContent = j.waiting ? "waiting " + j.waiting : j.done + " of " + j.total;
          if (j.finished) {
            let text = j.summary;
            if (j.left && j.left.length) text += " — left: " + j.left.join("; ");
            if (j.error) text += " — " + j.error;
            show(result, text, !!j.error || (j.left && j.left.length > 0) || j.missing > 0);
            result.dataset.finished = "true";
            break;
          }
          await new Promise((r) => setTimeout(r, 250));
        }
      } catch (e) {
        show(result, "Refused: " + e.message, true);
        result.dataset.finished = "true";
      }
    });
  }

  // Pause and resume a dispatcher trigger.
  document.querySelectorAll("button.trigger-act").forEach((b) => {
    b.addEventListener("click", async () => {
      const result = document.getElementById("result");
      try {
        const r = await post("/api/dispatcher/" + b.dataset.action, { trigger: b.dataset.trigger });
        const row = b.closest("tr");
        row.querySelector(".state").textContent = r.paused ? "paused" : "consuming";
        b.dataset.action = r.paused ? "resume" : "pause";
        b.textContent = r.paused ? "Resume" : "Pause";
        show(result, "trigger " + r.trigger + (r.paused ? " paused: its queue keeps its messages" : " consuming"), false);
      } catch (e) {
        show(result, "Refused: " + e.message, true);
      }
    });
  });

  // The live page: events matching the pattern as they pass.
  const live = document.getElementById("live");
  if (live) {
    const state = document.getElementById("live-state");
    const pauseBtn = document.getElementById("live-pause");
    const waiting = document.getElementById("live-waiting");
    const tbody = document.querySelector("#live-events tbody");
    const maxRows = 500;
    let paused = false;
    let held = [];
    let dropped = 0;
    function cell(tr, text) {
      const td = document.createElement("td");
      td.textContent = text || "";
      tr.appendChild(td);
      return td;
    }
    function addRow(ev) {
      const tr = document.createElement("tr");
      tr.dataset.id = ev.id;
      cell(tr, ev.time ? ev.time.replace("T", " ") : "-");
      cell(tr, ev.type + (ev.malformed ? " (malformed: " + ev.malformed + ")" : ""));
      cell(tr, ev.source);
      cell(tr, ev.node);
      const idc = cell(tr, "");
      const a = document.createElement("a");
      a.href = "/audit/event/" + encodeURIComponent(ev.id);
      a.textContent = ev.id;
      idc.appendChild(a);
      const pre = document.createElement("pre");
      pre.textContent = ev.body;
      cell(tr, "").appendChild(pre);
      tbody.insertBefore(tr, tbody.firstChild);
      while (tbody.children.length > maxRows) tbody.removeChild(tbody.lastChild);
    }
    const src = new EventSource("/api/live?pattern=" + encodeURIComponent(live.dataset.pattern));
    src.addEventListener("ready", () => { state.textContent = "watching " + live.dataset.pattern; live.dataset.ready = "true"; });
    src.addEventListener("event", (m) => {
      const ev = JSON.parse(m.data);
      if (paused) {
        // At most maxRows are kept while paused: the page shows no more.
        held.push(ev);
        if (held.length > maxRows) { held.shift(); dropped++; }
        waiting.textContent = held.length + " waiting" + (dropped ? " (" + dropped + " older ones dropped)" : "");
        return;
      }
      addRow(ev);
    });
    src.addEventListener("failed", (m) => { state.textContent = "stopped: " + JSON.parse(m.data).error; });
    src.onerror = () => { if (src.readyState === EventSource.CONNECTING) state.textContent = "reconnecting…"; };
    pauseBtn.addEventListener("click", () => {
      paused = !paused;
      pauseBtn.textContent = paused ? "Resume" : "Pause";
      live.dataset.paused = paused ? "true" : "false";
      if (!paused) {
        held.forEach(addRow);
        held = [];
        dropped = 0;
        waiting.textContent = "";
      }
    });
  }
})();

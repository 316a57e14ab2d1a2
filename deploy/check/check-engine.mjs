// Checks that Kubernetes manifests let a serving engine attach to the node
// agent, past what the schemas say (check-k8s.mjs):
//   - every tessera-node container (its args over the ConfigMap's [node]
//     when it reads it) turns on attach, with a mode that lets the group
//     connect (0660) and that group, on a writable hostPath or emptyDir;
//   - it asks for no GPU unless its store is cuda (or auto), and runs the
//     CUDA store only from an image built with CUDA (the Containerfile's
//     image, tessera:latest, says io.tessera.store) and with hostPID (CUDA
//     IPC handles open only within one PID namespace);
//   - a non-root pod that mounts a Secret has fsGroup (the files are
//     root's; the kubelet makes them the fsGroup's, group-readable);
//   - an engine pod mounts the node's attach directory and is in its group.
//
//   node check-engine.mjs [--containerfile FILE] FILE.yaml...
//                                     exit 0 when all hold, else 1
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const args = process.argv.slice(2);
let containerfile = null;
if (args[0] === "--containerfile") {
	containerfile = args[1];
	args.splice(0, 2);
}
const objs = [];
for (const file of args)
	for (const d of parseAllDocuments(readFileSync(file, "utf8"))) {
		const o = d.toJS();
		if (o !== null && typeof o === "object") objs.push({ file, o });
	}

// The store the image of deploy/Containerfile supports: its io.tessera.store label.
let latestStore = null;
if (containerfile !== null) {
	const m = readFileSync(containerfile, "utf8").match(/^LABEL\s+io\.tessera\.store="?([a-z]+)"?/m);
	latestStore = m ? m[1] : "unlabelled";
}

// [node] of the ConfigMap's tessera.ini: key -> value.
function iniNode() {
	const cm = objs.find(({ o }) => o.kind === "ConfigMap" && o.data?.["tessera.ini"] !== undefined);
	const out = {};
	let section = "";
	for (const raw of (cm?.o.data["tessera.ini"] ?? "").split("\n")) {
		const line = raw.trim();
		if (line === "" || line.startsWith(";") || line.startsWith("#")) continue;
		const s = line.match(/^\[(.*)\]$/);
		if (s) {
			section = s[1];
			continue;
		}
		const kv = line.match(/^([^=]+)=(.*)$/);
		if (kv && section === "node") out[kv[1].trim()] = kv[2].trim();
	}
	return { out, name: cm?.o.metadata?.name };
}
const ini = iniNode();

function podSpec(o) {
	if (o.kind === "Pod") return o.spec;
	if (["DaemonSet", "Deployment", "StatefulSet", "Job"].includes(o.kind)) return o.spec?.template?.spec;
	return null;
}

// The node's options: the ConfigMap's [node] when the container reads a
// mounted tessera-config with --config, then its --flag value args.
function nodeOptions(c, spec) {
	const opts = {};
	const a = c.args ?? [];
	const cfgVol = (spec.volumes ?? []).find((v) => v.configMap?.name === ini.name);
	if (a.includes("--config") && cfgVol && (c.volumeMounts ?? []).some((m) => m.name === cfgVol.name))
		Object.assign(opts, ini.out);
	for (let i = 0; i < a.length; i++)
		if (a[i].startsWith("--") && i + 1 < a.length && !a[i + 1].startsWith("--")) opts[a[i].slice(2)] = a[++i];
	return opts;
}

function mountOf(c, spec, path) {
	let best = null;
	for (const m of c.volumeMounts ?? [])
		if ((path === m.mountPath || path.startsWith(m.mountPath.replace(/\/$/, "") + "/")) &&
		    (best === null || m.mountPath.length > best.mountPath.length))
			best = m;
	const vol = best && (spec.volumes ?? []).find((v) => v.name === best.name);
	return best ? { mount: best, vol } : null;
}

function gpus(c) {
	const r = c.resources ?? {};
	return Number(r.limits?.["nvidia.com/gpu"] ?? r.requests?.["nvidia.com/gpu"] ?? 0);
}

const errs = [];
const attachDirs = []; // {host path, group} of every node
const pods = objs.map(({ file, o }) => ({ file, o, spec: podSpec(o) })).filter((p) => p.spec);
for (const { file, o, spec } of pods) {
	const name = `${file}: ${o.kind}/${o.metadata?.name ?? "?"}`;
	const psc = spec.securityContext ?? {};
	for (const c of spec.containers ?? []) {
		const where = `${name}: container ${c.name}`;
		const uid = c.securityContext?.runAsUser ?? psc.runAsUser;
		// Keys: a non-root pod reads root's Secret files through fsGroup.
		for (const m of c.volumeMounts ?? []) {
			const v = (spec.volumes ?? []).find((x) => x.name === m.name);
			if (v?.secret && uid !== 0 && psc.fsGroup === undefined)
				errs.push(`${where}: reads Secret ${v.secret.secretName} as uid ${uid ?? "of the image"} without securityContext.fsGroup`);
		}
		if ((c.command ?? [])[0] !== "tessera-node") continue;
		const opt = nodeOptions(c, spec);
		const store = opt.store ?? "auto";
		const cuda = store === "auto" || store.startsWith("cuda");
		if (gpus(c) > 0 && !cuda)
			errs.push(`${where}: asks for ${gpus(c)} nvidia.com/gpu with store ${store}: it takes the GPU from the engines`);
		if (cuda && latestStore !== null && c.image === "tessera:latest" && latestStore !== "cuda")
			errs.push(`${where}: store ${store} on tessera:latest, whose Containerfile is built without CUDA (io.tessera.store=${latestStore})`);
		if (store.startsWith("cuda") && !spec.hostPID)
			errs.push(`${where}: store ${store} without hostPID: engines in other pods cannot open its CUDA IPC handles`);
		if (opt.attach === undefined) {
			errs.push(`${where}: no attach: serving engines cannot reach the weights`);
			continue;
		}
		const mode = /^[0-7]{1,4}$/.test(opt["attach-mode"] ?? "") ? parseInt(opt["attach-mode"], 8) : null;
		if (mode === null || (mode & 0o060) !== 0o060)
			errs.push(`${where}: attach-mode ${opt["attach-mode"] ?? "unset"}: an engine of another user in the group cannot connect (0660)`);
		if (opt["attach-group"] === undefined)
			errs.push(`${where}: no attach-group: engines are not told which group connects`);
		const dir = opt.attach.endsWith("/") ? opt.attach.replace(/\/+$/, "") : opt.attach.replace(/\/[^/]*$/, "");
		const mv = mountOf(c, spec, dir);
		if (!mv || !(mv.vol?.hostPath || mv.vol?.emptyDir) || mv.mount.readOnly)
			errs.push(`${where}: attach ${opt.attach} is not on a writable hostPath or emptyDir volume an engine can share`);
		else if (mv.vol.hostPath)
			attachDirs.push({ path: mv.vol.hostPath.path + dir.slice(mv.mount.mountPath.replace(/\/$/, "").length),
					  group: opt["attach-group"], where });
	}
}
// Engines: pods other than the node's that mount its attach directory.
for (const a of attachDirs) {
	const engines = pods.filter(({ spec }) =>
		!(spec.containers ?? []).some((c) => (c.command ?? [])[0] === "tessera-node") &&
		(spec.volumes ?? []).some((v) => v.hostPath && (a.path === v.hostPath.path || a.path.startsWith(v.hostPath.path + "/"))));
	if (engines.length === 0)
		errs.push(`${a.where}: no engine pod mounts its attach directory ${a.path} (engine.example.yaml)`);
	for (const { file, o, spec } of engines) {
		const sc = spec.securityContext ?? {};
		const groups = [sc.runAsGroup, sc.fsGroup, ...(sc.supplementalGroups ?? [])].map(String);
		if (sc.runAsUser !== 0 && !groups.includes(String(a.group)))
			errs.push(`${file}: ${o.kind}/${o.metadata?.name}: not in group ${a.group} of the attach sockets (supplementalGroups)`);
	}
}
for (const e of errs) console.error(e);
console.log(`check-engine: ${pods.length} pod specs, ${errs.length} problems`);
process.exit(errs.length === 0 ? 0 : 1);

// Validates Kubernetes manifests offline: each YAML document against the
// Kubernetes OpenAPI schema of its apiVersion/kind (the validators that
// kubernetes-models ships precompiled with ajv), plus what those schemas let
// through: a field the schema does not know (a typo such as `imagee`) is an
// error, found by recording which properties the validator looked at.
//
//   node check-k8s.mjs FILE.yaml...    exit 0 when all are valid, else 1
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

function schemaName(apiVersion, kind) {
	const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["core", apiVersion];
	const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
	return `IoK8sApi${cap(group.split(".")[0])}${cap(version)}${kind}`;
}

// A view of obj that records every property path the validator reads and
// every object whose keys it lists (a map: any key is allowed there).
function watch(obj, path, seen, maps) {
	if (obj === null || typeof obj !== "object") return obj;
	return new Proxy(obj, {
		get(t, k, r) {
			const v = Reflect.get(t, k, r);
			if (typeof k !== "string") return v;
			seen.add(`${path}/${k}`);
			return watch(v, `${path}/${k}`, seen, maps);
		},
		has(t, k) {
			if (typeof k === "string") seen.add(`${path}/${k}`);
			return Reflect.has(t, k);
		},
		ownKeys(t) {
			maps.add(path);
			return Reflect.ownKeys(t);
		},
	});
}

function unknownFields(obj, path, seen, maps, out) {
	if (obj === null || typeof obj !== "object") return;
	for (const k of Object.keys(obj)) {
		const p = `${path}/${k}`;
		if (!maps.has(path) && !seen.has(p)) out.push(`${p || "/"}: unknown field '${k}'`);
		unknownFields(obj[k], p, seen, maps, out);
	}
}

async function checkDoc(doc) {
	if (doc === null || typeof doc !== "object") return ["not a mapping"];
	const { apiVersion, kind } = doc;
	if (typeof apiVersion !== "string" || typeof kind !== "string") return ["no apiVersion or kind"];
	let validate;
	try {
		({ validate } = await import(`kubernetes-models/_schemas/${schemaName(apiVersion, kind)}`));
	} catch {
		return [`unknown apiVersion/kind ${apiVersion}/${kind}`];
	}
	const seen = new Set(), maps = new Set(), errs = [];
	if (!validate(watch(doc, "", seen, maps)))
		for (const e of validate.errors) errs.push(`${e.instancePath || "/"}: ${e.message ?? e.keyword} ${JSON.stringify(e.params)}`);
	unknownFields(doc, "", seen, maps, errs);
	return errs;
}

let bad = 0, docs = 0;
for (const file of process.argv.slice(2)) {
	const parsed = parseAllDocuments(readFileSync(file, "utf8"));
	for (const d of parsed) {
		if (d.errors.length > 0) {
			console.error(`${file}: YAML: ${d.errors[0].message.split("\n")[0]}`);
			bad++;
			continue;
		}
		const obj = d.toJS();
		if (obj === null) continue; // an empty document
		docs++;
		const name = `${obj?.kind ?? "?"}/${obj?.metadata?.name ?? "?"}`;
		for (const e of await checkDoc(obj)) {
			console.error(`${file}: ${name}: ${e}`);
			bad++;
		}
	}
}
if (docs === 0 && bad === 0) {
	console.error("check-k8s: no manifests given");
	process.exit(1);
}
console.log(`check-k8s: ${docs} objects, ${bad} problems`);
process.exit(bad === 0 ? 0 : 1);

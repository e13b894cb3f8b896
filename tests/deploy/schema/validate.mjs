// validate.mjs: checks Kubernetes objects against the API's schemas.
//
// Input (stdin): a JSON array of {"where": "...", "object": {...}}.
// Output: one line per problem, "<where>: <path> <message>"; exit 0 when
// there is none, 1 when there are problems, 2 when it cannot run.
//
// Two checks per object, together what the API server's strict decoding
// and validation of the schema reject (not its semantic checks):
//   * the JSON schema of its kind (types, required fields, enums, formats):
//     kubernetes-models for built-in kinds, @kubernetes-models/
//     prometheus-operator for monitoring.coreos.com, volumesnapshotclass-v1.json
//     and volumegroupsnapshotclass-v1.json (written from the
//     external-snapshotter CRDs, v1) for VolumeSnapshotClass and
//     VolumeGroupSnapshotClass;
//   * no unknown field (the schemas above allow any): every field name is
//     looked up in the generated models of @kubernetes/client-node (the
//     Kubernetes OpenAPI spec), recursively; the snapshot class schemas
//     forbid unknown fields themselves.  monitoring.coreos.com objects get the
//     first check only.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import Ajv from "ajv";
import * as api from "@kubernetes/client-node/dist/gen/models/all.js";
import { validate as validateObjectMeta } from
    "@kubernetes-models/apimachinery/_schemas/IoK8sApimachineryPkgApisMetaV1ObjectMeta";

const here = (f) => fileURLToPath(new URL(f, import.meta.url));
// The custom resources' classes: "group/version kind" -> a compiled schema.
const crdSchemas = {};
for (const [key, file] of [["snapshot.storage.k8s.io/v1 VolumeSnapshotClass", "volumesnapshotclass-v1.json"],
                           ["groupsnapshot.storage.k8s.io/v1 VolumeGroupSnapshotClass",
                            "volumegroupsnapshotclass-v1.json"]])
    crdSchemas[key] = new Ajv({ allErrors: true, strict: true }).compile(
        JSON.parse(readFileSync(here(file), "utf8")));

function split(apiVersion) {
    const i = apiVersion.lastIndexOf("/");
    return i < 0 ? ["", apiVersion] : [apiVersion.slice(0, i), apiVersion.slice(i + 1)];
}

// The models' type names: "V1Container", "Array<V1Volume>",
// "{ [key: string]: string; }", "string", "IntOrString", ...
function unknownFields(value, type, path, out) {
    if (value === null || value === undefined) return;
    let m = /^Array<(.+)>$/.exec(type);
    if (m) {
        if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, m[1], `${path}/${i}`, out));
        return;
    }
    m = /^\{ \[key: string\]: (.+); \}$/.exec(type);
    if (m) {
        if (typeof value === "object") for (const [k, v] of Object.entries(value)) unknownFields(v, m[1], `${path}/${k}`, out);
        return;
    }
    const model = api[type];
    if (!model || typeof model.getAttributeTypeMap !== "function" || typeof value !== "object") return;
    const fields = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
    for (const [k, v] of Object.entries(value)) {
        if (!fields.has(k)) out.push(`${path}/${k} is not a field of ${type.replace(/^V\d\w*?(?=[A-Z])/, "")}`);
        else unknownFields(v, fields.get(k), `${path}/${k}`, out);
    }
}

function schemaErrors(errors) {
    return (errors || []).map((e) => `${e.instancePath || "/"} ${e.message}` +
        (e.params && e.params.allowedValues ? ` (${e.params.allowedValues.join(", ")})` : "") +
        (e.params && e.params.additionalProperty ? `: ${e.params.additionalProperty}` : ""));
}

async function check(obj) {
    const out = [];
    if (!obj || typeof obj.apiVersion !== "string" || typeof obj.kind !== "string")
        return ["no apiVersion/kind"];
    const [group, version] = split(obj.apiVersion);
    const kind = obj.kind;
    const validateCrd = crdSchemas[`${obj.apiVersion} ${kind}`];
    if (validateCrd) {
        if (!validateCrd(obj)) out.push(...schemaErrors(validateCrd.errors));
        if (obj.metadata !== undefined) {
            if (!validateObjectMeta(obj.metadata)) out.push(...schemaErrors(validateObjectMeta.errors).map((e) => "/metadata" + e));
            unknownFields(obj.metadata, "V1ObjectMeta", "/metadata", out);
        }
        return out;
    }
    const pkg = group === "monitoring.coreos.com" ? "@kubernetes-models/prometheus-operator/" + group
              : group === "" ? "kubernetes-models" : "kubernetes-models/" + group;
    let Model;
    try {
        Model = (await import(`${pkg}/${version}/${kind}`))[kind];
    } catch {
        return [`no schema for ${obj.apiVersion} ${kind}`];
    }
    try {
        new Model(obj).validate();
    } catch (e) {
        out.push(...(e.errors ? schemaErrors(e.errors) : [String(e.message || e)]));
    }
    if (group !== "monitoring.coreos.com") {
        const type = version.charAt(0).toUpperCase() + version.slice(1) + kind;
        if (!api[type]) out.push(`no field list for ${obj.apiVersion} ${kind}`);
        else unknownFields(obj, type, "", out);
    }
    return out;
}

let input;
try {
    input = JSON.parse(readFileSync(0, "utf8"));
} catch (e) {
    console.error(`validate.mjs: input is not JSON: ${e.message}`);
    process.exit(2);
}
let problems = 0;
for (const { where, object } of input) {
    for (const p of await check(object)) {
        console.log(`${where}: ${p}`);
        problems++;
    }
}
process.exit(problems ? 1 : 0);

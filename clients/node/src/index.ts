export * from "./calls.js";
export * from "./errors.js";
export * from "./client.js";
export * from "./keeper.js";
export * from "./elector.js";
export * from "./sets.js";

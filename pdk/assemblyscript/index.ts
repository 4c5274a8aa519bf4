// The package's entry for AssemblyScript's package resolution (import "@toolhost/pdk").
export * from "./assembly/index";

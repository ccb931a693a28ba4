#!/usr/bin/env node
// Compiles contracts/*.sol with the solc of tools/chain/node_modules (the
// official compiler, from the npm registry) and writes each contract's
// creation bytecode, hex, to OUT/<Contract>.bin (OUT defaults to
// contracts/build). The settings are fixed here, so the same sources give
// the same bytes: crates/cli/tests/chain_contracts.rs compiles again into a
// temporary folder and compares with the checked-in files.
'use strict';
const fs = require('fs');
const path = require('path');
const solc = require('solc');

const root = path.resolve(__dirname, '..', '..');
const sourcesDir = path.join(root, 'contracts');
const out = process.argv[2] ? path.resolve(process.argv[2]) : path.join(sourcesDir, 'build');

const sources = {};
for (const file of fs.readdirSync(sourcesDir).filter((f) => f.endsWith('.sol')).sort()) {
  sources[file] = { content: fs.readFileSync(path.join(sourcesDir, file), 'utf8') };
}
const input = {
  language: 'Solidity',
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: 'cancun',
    outputSelection: { '*': { '*': ['evm.bytecode.object'] } },
  },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === 'error');
if (errors.length) {
  for (const e of errors) console.error(e.formattedMessage);
  process.exit(1);
}
fs.mkdirSync(out, { recursive: true });
for (const file of Object.keys(output.contracts).sort()) {
  for (const [name, contract] of Object.entries(output.contracts[file])) {
    const bytecode = contract.evm.bytecode.object;
    if (!bytecode) continue; // abstract
    fs.writeFileSync(path.join(out, `${name}.bin`), bytecode + '\n');
  }
}
console.log(`solc ${solc.version()}: ${Object.keys(sources).length} sources compiled into ${out}`);

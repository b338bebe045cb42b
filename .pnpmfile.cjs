// pnpm 12 ignores `nodedir` from .npmrc, so node-gyp would try to download Node's headers
// (no network here). Point it at the headers installed with Node itself.
module.exports = {
  hooks: {
    updateConfig(config) {
      config.extraEnv = { ...(config.extraEnv ?? {}), npm_config_nodedir: process.env.npm_config_nodedir ?? "/usr" };
      return config;
    },
  },
};

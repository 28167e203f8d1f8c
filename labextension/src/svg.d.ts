// SVG files are imported as strings (the JupyterLab builder's asset/source rule).
declare module '*.svg' {
  const value: string;
  export default value;
}
